//! An AWS SDK configuration from the standard environment variables, for
//! the daemon's SNS publisher and `dead-letters` on SQS. This binary does
//! not link `aws-config` (its credential chain pulls in SSO and STS
//! clients): profiles, SSO and instance roles are not read; set
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`
//! for temporary credentials).

use outbox_sns::aws_types::SdkConfig;
use outbox_sns::aws_types::region::Region;

use crate::error::CliError;

/// `region` and `endpoint` override `AWS_REGION` (or `AWS_DEFAULT_REGION`)
/// and `AWS_ENDPOINT_URL_<SERVICE>` / `AWS_ENDPOINT_URL`; credentials come
/// from the environment. `what` names the setting in errors.
pub fn sdk_config(
    what: &str,
    service: &str,
    region: Option<&str>,
    endpoint: Option<&str>,
) -> Result<SdkConfig, CliError> {
    use aws_credential_types::Credentials;
    use aws_credential_types::provider::SharedCredentialsProvider;
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let region = region
        .map(str::to_owned)
        .or_else(|| var("AWS_REGION"))
        .or_else(|| var("AWS_DEFAULT_REGION"))
        .ok_or_else(|| CliError::usage(format!("{what}: set a region (AWS_REGION)")))?;
    let (Some(key), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) else {
        return Err(CliError::usage(format!(
            "{what}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )));
    };
    let credentials = Credentials::new(key, secret, var("AWS_SESSION_TOKEN"), None, "environment");
    let mut config = SdkConfig::builder()
        .region(Region::new(region))
        .credentials_provider(SharedCredentialsProvider::new(credentials))
        .behavior_version(outbox_sns::aws_sdk_sns::config::BehaviorVersion::latest());
    let endpoint = endpoint
        .map(str::to_owned)
        .or_else(|| var(&format!("AWS_ENDPOINT_URL_{service}")))
        .or_else(|| var("AWS_ENDPOINT_URL"));
    if let Some(endpoint) = endpoint {
        config = config.endpoint_url(endpoint);
    }
    Ok(config.build())
}
