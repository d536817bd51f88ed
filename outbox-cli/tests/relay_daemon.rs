//! `outbox relay` run as a deployment would: a TOML file, PostgreSQL and
//! Redis on loopback, `/metrics` and `/health` over HTTP, SIGTERM to stop.

use std::time::Duration;

use outbox_core::OutboxWriter;
use outbox_core::testing::events_over_keys;
use outbox_sqlx::StoreConfig;
use outbox_sqlx::postgres::PgStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn pg_url() -> String {
    std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".into())
}

fn redis_url() -> String {
    std::env::var("OUTBOX_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn unique(stem: &str) -> String {
    format!(
        "{stem}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// `GET path` → (status line, body).
async fn get(address: &str, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// A settings file, removed on drop.
struct ConfigFile(std::path::PathBuf);

impl ConfigFile {
    fn with(body: &str) -> Self {
        let path = std::env::temp_dir().join(format!("outbox-relay-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(&path, body).unwrap();
        Self(path)
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The daemon publishes a backlog to Redis, says so on `/metrics`, is
/// healthy while running, and on SIGTERM drains and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_relays_to_redis_serves_metrics_and_drains_on_sigterm() {
    let pool = sqlx::PgPool::connect(&pg_url())
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL unreachable at {}: {e}", pg_url()));
    let schema = unique("daemon");
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&pool)
        .await
        .unwrap();
    let store = PgStore::new(
        pool,
        StoreConfig::with_tables(
            outbox_sqlx::TableNames::default()
                .in_schema(&schema)
                .unwrap(),
        ),
    );
    store.migrate().await.unwrap();
    let events = events_over_keys(50, 5);
    OutboxWriter::enqueue(&store, &events).await.unwrap();

    let prefix = format!("{}:", unique("daemon"));
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let config = ConfigFile::with(&format!(
        r#"
url = "{url}"
schema = "{schema}"

[relay]
id = "daemon-test"
poll_interval = "100ms"

[broker]
kind = "redis"
url = "{redis}"
stream_prefix = "{prefix}"

[http]
listen = "{listen}"
"#,
        url = pg_url(),
        redis = redis_url(),
    ));
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["relay", "--config"])
        .arg(&config.0)
        .env_remove("OUTBOX_URL")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let client = redis::Client::open(redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("{prefix}invoice.paid");
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let len: usize = redis::cmd("XLEN")
                .arg(&stream)
                .query_async(&mut redis)
                .await
                .unwrap();
            if len >= 50 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the daemon published the backlog");

    let (status, body) = get(&listen, "/health").await;
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    let (status, metrics) = get(&listen, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let published: f64 = metrics
        .lines()
        .find(|l| l.starts_with("outbox_relay_published_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no published counter in:\n{metrics}"));
    assert_eq!(published, 50.0, "{metrics}");
    let (status, _) = get(&listen, "/nope").await;
    assert_eq!(status, "HTTP/1.1 404 Not Found");

    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("the daemon exits after SIGTERM")
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}\n{log}", output.status);
    assert!(log.contains("SIGTERM: draining"), "{log}");
    assert!(log.contains("relay stopped"), "{log}");
    let len: usize = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(len, 50, "nothing published twice");
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// Settings that cannot work are refused before anything starts, with the
/// reason and exit status 2: a typo'd key, a duration without a unit, an
/// unknown broker kind, a relay whose publish timeout outlives its lease.
#[tokio::test]
async fn bad_settings_are_refused_with_the_reason() {
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
