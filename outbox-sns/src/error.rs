//! Classifies AWS errors into the relay's classes. One table for SNS and SQS.
//!
//! | what happened | class |
//! |---|---|
//! | throttling (`Throttling`, `Throttled`, `KMSThrottling`, …), HTTP 5xx, `InternalError`, `ServiceUnavailable`, an unreadable response | transient |
//! | the event itself is invalid (`InvalidParameter`, `InvalidParameterValue`, `ValidationError`; too large) | permanent, that event only |
//! | configuration, not the event: topic or queue not found, authorization denied, bad credentials or signature, KMS key disabled/missing/inaccessible, endpoint disabled | outage |
//! | connection refused, reset or timed out; no response in time | outage |
//! | any other 4xx code | transient (retried with backoff; never dead-lettered on a code this table does not know) |

use aws_sdk_sns::error::{ProvideErrorMetadata, SdkError};
use outbox_core::ErrorClass;

/// The class of an AWS error code (SNS or SQS, with or without the
/// `Exception` suffix or the `AWS.SimpleQueueService.` prefix).
pub fn classify_code(code: &str) -> ErrorClass {
    let code = code.strip_prefix("AWS.SimpleQueueService.").unwrap_or(code);
    let code = code.strip_suffix("Exception").unwrap_or(code);
    match code {
        "Throttling"
        | "Throttled"
        | "ThrottledException"
        | "RequestThrottled"
        | "RequestLimitExceeded"
        | "TooManyRequests"
        | "KMSThrottling"
        | "SlowDown"
        | "PriorRequestNotComplete"
        | "BandwidthLimitExceeded"
        | "RequestTimeout"
        | "InternalError"
        | "InternalFailure"
        | "ServiceUnavailable"
        | "KmsThrottled" => ErrorClass::Transient,
        "NotFound"
        | "AuthorizationError"
        | "AccessDenied"
        | "KMSDisabled"
        | "KMSAccessDenied"
        | "KMSNotFound"
        | "KMSInvalidState"
        | "KMSOptInRequired"
        | "KmsDisabled"
        | "KmsAccessDenied"
        | "KmsNotFound"
        | "KmsInvalidState"
        | "KmsOptInRequired"
        | "InvalidSecurity"
        | "InvalidClientTokenId"
        | "UnrecognizedClient"
        | "SignatureDoesNotMatch"
        | "IncompleteSignature"
        | "ExpiredToken"
        | "MissingAuthenticationToken"
        | "OptInRequired"
        | "EndpointDisabled"
        | "InvalidAccessKeyId"
        | "NonExistentQueue"
        | "QueueDoesNotExist"
        | "InvalidAddress"
        | "UnsupportedOperation" => ErrorClass::Outage,
        "InvalidParameter"
        | "InvalidParameterValue"
        | "ValidationError"
        | "Validation"
        | "ParameterValueInvalid"
        | "InvalidMessageContents"
        | "InvalidAttributeValue"
        | "InvalidAttributeName" => ErrorClass::Permanent,
        // Codes this table does not know, 4xx or 5xx: retried with
        // backoff, never dead-lettered on a guess.
        _ => ErrorClass::Transient,
    }
}

/// The class of a whole request's failure.
pub fn classify_sdk_error<E: ProvideErrorMetadata>(error: &SdkError<E>) -> ErrorClass {
    match error {
        // No request was sent: no region, no credentials, no HTTP client
        // in the SdkConfig. Configuration, so the relay pauses.
        SdkError::ConstructionFailure(_) => ErrorClass::Outage,
        // Refused, reset, TLS failure, or no answer in time: unreachable.
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) => ErrorClass::Outage,
        // An answer that could not be read: try again.
        SdkError::ResponseError(_) => ErrorClass::Transient,
        SdkError::ServiceError(service) => {
            match service.err().code() {
                Some(code) => classify_code(code),
                // A bare status: 5xx and unknown 4xx alike are retried.
                None => ErrorClass::Transient,
            }
        }
        _ => ErrorClass::Transient,
    }
}

/// `code: message` of a service error, or the whole error chain otherwise.
pub(crate) fn describe<E>(error: &SdkError<E>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    if let SdkError::ServiceError(service) = error {
        let err = service.err();
        return format!(
            "{} (HTTP {}): {}",
            err.code().unwrap_or("unknown error"),
            service.raw().status().as_u16(),
            err.message().unwrap_or("")
        );
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_classes() {
        let cases = [
            ("Throttling", ErrorClass::Transient),
            ("ThrottledException", ErrorClass::Transient),
            ("KMSThrottlingException", ErrorClass::Transient),
            ("InternalError", ErrorClass::Transient),
            ("NotFound", ErrorClass::Outage),
            ("AuthorizationError", ErrorClass::Outage),
            ("KMSDisabledException", ErrorClass::Outage),
            ("InvalidClientTokenId", ErrorClass::Outage),
            (
                "AWS.SimpleQueueService.NonExistentQueue",
                ErrorClass::Outage,
            ),
            ("QueueDoesNotExist", ErrorClass::Outage),
            ("InvalidParameter", ErrorClass::Permanent),
            ("InvalidParameterValue", ErrorClass::Permanent),
            ("SomethingNew", ErrorClass::Transient),
        ];
        for (code, class) in cases {
            assert_eq!(classify_code(code), class, "{code}");
        }
        assert_eq!(classify_code(""), ErrorClass::Transient);
    }
}
