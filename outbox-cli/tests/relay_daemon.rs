//! `outbox relay` run as a deployment would: a TOML file, PostgreSQL and
//! Redis on loopback, `/metrics` and `/health` over HTTP, SIGTERM to stop.

use std::time::Duration;

use outbox_core::OutboxWriter;
use outbox_core::testing::{CuttableProxy, events_over_keys};
use outbox_sqlx::postgres::EndToEndDb;
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

/// The daemon rides out a broker outage (healthy, the backlog and its lag
/// on `/metrics`), publishes the backlog to Redis once it is back, counts
/// it on `/metrics`, and on SIGTERM drains and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_relays_to_redis_serves_metrics_and_drains_on_sigterm() {
    let db = EndToEndDb::create("daemon").await;
    let (store, schema) = (&db.store, &db.schema);
    let events = events_over_keys(50, 5);
    OutboxWriter::enqueue(&**store, &events).await.unwrap();

    // Redis behind a proxy, cut at first.
    let redis_port = redis_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
        .unwrap_or(6379);
    let proxy = CuttableProxy::start(
        ([127, 0, 0, 1], redis_port).into(),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    )
    .unwrap();
    proxy.cut();
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
url = "redis://{redis}"
stream_prefix = "{prefix}"

[http]
listen = "{listen}"
"#,
        url = pg_url(),
        redis = proxy.address(),
    ));
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["relay", "--config"])
        .arg(&config.0)
        .env_remove("OUTBOX_URL")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let claimable = r#"outbox_events{event_type="invoice.paid",state="claimable"}"#;
    let lag = r#"outbox_oldest_claimable_age_seconds{event_type="invoice.paid"}"#;
    let published = r#"outbox_relay_published_total{relay="daemon-test"}"#;
    proxy.wait_for_refused(3, Duration::from_secs(60)).await;
    let during = scrape_until(&listen, |m| {
        gauge(m, claimable) == Some(50.0) && gauge(m, lag).is_some_and(|l| l > 0.0)
    })
    .await;
    assert_eq!(gauge(&during, published), None, "nothing published yet");
    let (status, _) = get(&listen, "/health").await;
    assert_eq!(status, "HTTP/1.1 200 OK", "healthy through a broker outage");

    proxy.restore();
    // The gauges are read at the scrape, the counter when the relay acks:
    // one scrape may fall between the two.
    scrape_until(&listen, |m| {
        gauge(m, published) == Some(50.0)
            && gauge(m, claimable) == Some(0.0)
            && gauge(m, lag) == Some(0.0)
    })
    .await;
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

    let client = redis::Client::open(redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("{prefix}invoice.paid");
    let len: usize = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(len, 50, "each event published once");
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// Scrapes `/metrics` until `done` holds (60 s at most); returns the text.
async fn scrape_until(listen: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, metrics) = get(listen, "/metrics").await;
        if done(&metrics) {
            return metrics;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/metrics did not reach the expected values within 60 s; last:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of the sample `name` (with its labels) in Prometheus text.
fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
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
