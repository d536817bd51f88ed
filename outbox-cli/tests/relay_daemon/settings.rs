//! The daemon's settings: bad ones refused with the reason, flags and the
//! environment over the file.

use super::*;

/// Settings that cannot work are refused before anything starts, with the
/// reason and exit status 2: a typo'd key, a duration without a unit, an
/// unknown broker kind, a relay whose publish timeout outlives its lease.
#[tokio::test]
pub(super) async fn bad_settings_are_refused_with_the_reason() {
    let cases = [
        (
            "url = \"sqlite:x.db\"\n[broker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1\"\n[relay]\nbatchsize = 5\n",
            "unknown field `batchsize`",
        ),
        (
            "url = \"sqlite:x.db\"\n[broker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1\"\n[relay]\nlease = \"30\"\n",
            "relay.lease",
        ),
        (
            "url = \"sqlite:x.db\"\n[broker]\nkind = \"nats\"\nurl = \"nats://127.0.0.1\"\n",
            "unknown variant `nats`",
        ),
        (
            "url = \"sqlite:x.db\"\n[broker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1\"\n[relay]\nlease = \"5s\"\npublish_timeout = \"10s\"\n",
            "publish_timeout",
        ),
        (
            "url = \"sqlite:x.db\"\n[broker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1\"\n[relay]\npoison = \"ignore\"\n",
            "relay.poison",
        ),
    ];
    for (body, reason) in cases {
        let config = ConfigFile::with(body);
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["relay", "--config"])
            .arg(&config.0)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{body}: {stderr}");
        assert!(stderr.contains(reason), "{body}: {stderr}");
    }
}

/// One precedence for the store's settings: a flag over the environment
/// over the file. The file names a store that does not exist (a stale
/// copy); `--url` and `OUTBOX_SCHEMA` name the real one, and the daemon
/// starts on it, saying so in its start-up line (password redacted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn flags_and_the_environment_override_the_file() {
    use tokio::io::AsyncBufReadExt;

    let db = EndToEndDb::create("precedence").await;
    let config = ConfigFile::with(&format!(
        r#"
url = "postgres://app:filepassword@127.0.0.1:1/nowhere"
schema = "a_schema_that_does_not_exist"

[broker]
kind = "redis"
url = "{redis}"
stream_prefix = "{prefix}:"
"#,
        redis = redis_url(),
        prefix = unique("precedence"),
    ));
    let flag_url = pg_url().replacen(
        "postgres://postgres@",
        "postgres://postgres:flagpassword@",
        1,
    );
    let mut child = daemon_command()
        .args(["relay", "--config"])
        .arg(&config.0)
        .args(["--url", &flag_url])
        .env("OUTBOX_SCHEMA", &db.schema)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let started = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("relay starting") {
                return line;
            }
        }
        panic!("the daemon exited before starting");
    })
    .await
    .expect("the daemon starts on the flag's store");
    assert!(
        started.contains(&format!("schema=\"{}\"", db.schema))
            || started.contains(&format!("schema={}", db.schema)),
        "{started}"
    );
    assert!(
        started.contains("postgres:***@"),
        "the URL is redacted: {started}"
    );
    assert!(!started.contains("flagpassword"), "{started}");
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
}
