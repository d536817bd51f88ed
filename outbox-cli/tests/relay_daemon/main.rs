//! `outbox relay` run as a deployment would: a TOML file, PostgreSQL and
//! Redis on loopback, `/metrics` and `/health` over HTTP, SIGTERM to stop.

use std::time::Duration;

use outbox_core::relay::metrics as names;
use outbox_core::testing::CuttableProxy;
use outbox_core::{EventId, NewEvent, OutboxWriter};
use outbox_sqlx::postgres::EndToEndDb;
use prometheus_parse::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod scrapes;
mod settings;

mod outages;
mod tenants;

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
    try_get(address, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} from the daemon: {e}"))
}

/// `GET path`, or the connection error (the daemon may not listen yet).
async fn try_get(address: &str, path: &str) -> std::io::Result<(String, String)> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: {address}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    Ok((head.lines().next().unwrap().to_owned(), body.to_owned()))
}

/// A settings file, removed on drop.
struct ConfigFile(std::path::PathBuf);

impl ConfigFile {
    fn with(body: &str) -> Self {
        let path = std::env::temp_dir().join(format!("outbox-relay-{}.toml", uuid::Uuid::new_v4()));
        std::fs::write(&path, body).unwrap();
        Self(path)
    }

    /// The settings of an outage test: the relay `relay_id` on `schema`,
    /// outage pauses short, `/health` 503 after 2 s in outage, and
    /// `broker` (its `[broker]` table, and any sub-table).
    fn for_outage(schema: &str, relay_id: &str, listen: &str, broker: &str) -> Self {
        Self::with(&format!(
            r#"
url = "{url}"
schema = "{schema}"

[relay]
id = "{relay_id}"
poll_interval = "100ms"
outage_initial_pause = "100ms"
outage_max_pause = "500ms"

[http]
listen = "{listen}"
outage_unhealthy_after = "2s"

{broker}
"#,
            url = pg_url(),
        ))
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The daemon rides out a broker outage (healthy, the backlog and its lag
/// on `/metrics`), publishes the billing example's events (two types) to
/// Redis once it is back, counts them on `/metrics`, and on SIGTERM drains
/// and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_relays_to_redis_serves_metrics_and_drains_on_sigterm() {
    let db = EndToEndDb::create("daemon").await;
    let (store, schema) = (&db.store, &db.schema);
    let events = billing_events(10);
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
dashboard = "/ui"
"#,
        url = pg_url(),
        redis = proxy.address(),
    ));
    let child = spawn_daemon(&config);

    let claimable = r#"outbox_events{event_type="invoice.paid",state="claimable"}"#;
    let failures = r#"outbox_events{event_type="payment.failed",state="claimable"}"#;
    let lag = r#"outbox_oldest_claimable_age_seconds{event_type="invoice.paid"}"#;
    let published = r#"outbox_relay_published_total{relay="daemon-test"}"#;
    proxy.wait_for_refused(3, Duration::from_secs(60)).await;
    let during = scrape_until(&listen, |m| {
        gauge(m, claimable) == Some(10.0)
            && gauge(m, failures) == Some(20.0)
            && gauge(m, lag).is_some_and(|l| l > 0.0)
    })
    .await;
    assert_eq!(
        gauge(&during, published),
        Some(0.0),
        "nothing published yet, and the counter is there at 0"
    );
    let scrape = exposition(&during);
    for cause in outbox_core::relay::metrics::FAILED_CAUSES {
        assert_eq!(
            sample(
                &scrape,
                names::FAILED,
                &[("relay", "daemon-test"), ("cause", cause)]
            ),
            Some(&Value::Counter(0.0)),
            "{cause} counted from the start"
        );
    }
    let (status, _) = get(&listen, "/health").await;
    assert_eq!(status, "HTTP/1.1 200 OK", "healthy through a broker outage");
    // The dashboard under /ui shows the same backlog, read-only (no token).
    let (status, page) = get(&listen, "/ui/").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        page.contains(r#"data-type="invoice.paid" data-state="claimable">10<"#)
            && page.contains("read-only")
            && page.contains(r#"href="/ui/failed""#),
        "{page}"
    );
    assert_eq!(get(&listen, "/ui/assets/app.js").await.0, "HTTP/1.1 200 OK");
    assert_eq!(get(&listen, "/uix").await.0, "HTTP/1.1 404 Not Found");

    proxy.restore();
    // The gauges are read at the scrape, the counter when the relay acks:
    // one scrape may fall between the two.
    scrape_until(&listen, |m| {
        gauge(m, published) == Some(30.0)
            && gauge(m, claimable) == Some(0.0)
            && gauge(m, failures) == Some(0.0)
            && gauge(m, lag) == Some(0.0)
    })
    .await;
    let after = exposition(&try_get(&listen, "/metrics").await.unwrap().1);
    for (name, bounds) in outbox_core::relay::metrics::HISTOGRAM_BUCKETS {
        if name == outbox_core::relay::metrics::REST_SECONDS {
            // Recorded only by a fleet's tenant resting beside another.
            continue;
        }
        let Some(Value::Histogram(buckets)) = sample(&after, name, &[("relay", "daemon-test")])
        else {
            panic!("{name} is a histogram: {:?}", sample(&after, name, &[]));
        };
        let les: Vec<f64> = buckets.iter().map(|b| b.less_than).collect();
        let mut expected = bounds.to_vec();
        expected.push(f64::INFINITY);
        assert_eq!(les, expected, "{name}'s documented buckets");
        assert!(buckets.last().unwrap().count >= 1.0, "{name} recorded");
    }
    let (status, _) = get(&listen, "/nope").await;
    assert_eq!(status, "HTTP/1.1 404 Not Found");

    stop_with_sigterm(child).await;

    let client = redis::Client::open(redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    for (event_type, expected) in [("invoice.paid", 10), ("payment.failed", 20)] {
        let stream = format!("{prefix}{event_type}");
        let len: usize = redis::cmd("XLEN")
            .arg(&stream)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(len, expected, "each {event_type} event published once");
        let _: () = redis::cmd("DEL")
            .arg(&stream)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
}

fn spawn_daemon(config: &ConfigFile) -> tokio::process::Child {
    daemon_command()
        .args(["relay", "--config"])
        .arg(&config.0)
        .spawn()
        .unwrap()
}

/// `outbox relay` configured by `OUTBOX_*` variables only, no file.
fn spawn_daemon_from_environment(variables: &[(&str, &str)]) -> tokio::process::Child {
    daemon_command()
        .arg("relay")
        .envs(variables.iter().copied())
        .spawn()
        .unwrap()
}

/// The binary with no `OUTBOX_*` settings inherited from the test's own
/// environment.
fn daemon_command() -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("OUTBOX_")) {
        command.env_remove(name);
    }
    command
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

/// SIGTERM: the daemon drains, says so, and exits 0.
async fn stop_with_sigterm(child: tokio::process::Child) {
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
}

fn free_address() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

fn kafka_bootstrap() -> String {
    std::env::var("OUTBOX_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:19092".into())
}

/// The billing example's events: per subscription, two failed payments
/// then the paid invoice (`payment.failed`, `payment.failed`,
/// `invoice.paid`), keyed by subscription.
fn billing_events(subscriptions: usize) -> Vec<NewEvent> {
    let mut events = Vec::new();
    for attempt in ["a1", "a2", "a3"] {
        for sub in 0..subscriptions {
            let event_type = if attempt == "a3" {
                "invoice.paid"
            } else {
                "payment.failed"
            };
            events.push(
                NewEvent::builder(event_type, "invoice", format!("inv-{sub}"))
                    .event_id(EventId::random())
                    .partition_key(format!("sub-{sub}"))
                    .payload(&serde_json::json!({
                        "invoice_id": format!("inv-{sub}"),
                        "attempt": attempt,
                        "amount_cents": 2900,
                    }))
                    .correlation_id(format!("billing-run-{attempt}"))
                    .build()
                    .unwrap(),
            );
        }
    }
    events
}

/// `curl -sf URL`: the scrape an operator or Prometheus makes.
async fn curl(url: &str) -> String {
    let output = tokio::process::Command::new("curl")
        .args(["-sf", "--max-time", "5", url])
        .output()
        .await
        .expect("curl is installed");
    assert!(output.status.success(), "curl {url}: {:?}", output.status);
    String::from_utf8(output.stdout).unwrap()
}

/// The same daemon with `kind = "kafka"`, configured by the environment
/// alone (no file), on the billing example's events (two types, ten
/// subscriptions): each reaches its topic once, each subscription's events
/// in enqueue order, `curl /metrics` counts them per type, and SIGTERM
/// drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_relays_the_billing_events_to_kafka() {
    use outbox_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use outbox_kafka::rdkafka::client::DefaultClientContext;
    use outbox_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
    use outbox_kafka::rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

    let db = EndToEndDb::create("daemon").await;
    let events = billing_events(10);
    OutboxWriter::enqueue(&*db.store, &events).await.unwrap();
    let prefix = format!("{}.", unique("daemon"));
    let topics = [
        format!("{prefix}payment.failed"),
        format!("{prefix}invoice.paid"),
    ];
    let bootstrap = kafka_bootstrap();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let new_topics: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, 2, TopicReplication::Fixed(1)))
        .collect();
    for created in admin
        .create_topics(
            &new_topics,
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap_or_else(|e| panic!("Kafka broker unreachable at {bootstrap}: {e}"))
    {
        created.unwrap();
    }

    let listen = free_address();
    let url = pg_url();
    let child = spawn_daemon_from_environment(&[
        ("OUTBOX_URL", &url),
        ("OUTBOX_SCHEMA", &db.schema),
        ("OUTBOX_RELAY_ID", "daemon-kafka"),
        ("OUTBOX_BROKER_KIND", "kafka"),
        ("OUTBOX_BROKER_BOOTSTRAP", &bootstrap),
        ("OUTBOX_BROKER_TOPIC_PREFIX", &prefix),
        ("OUTBOX_HTTP_LISTEN", &listen),
    ]);
    let published = r#"outbox_relay_published_total{relay="daemon-kafka"}"#;
    let drained: Vec<String> = [
        ("payment.failed", "claimable"),
        ("invoice.paid", "claimable"),
        ("payment.failed", "failed"),
    ]
    .iter()
    .map(|(event_type, state)| {
        format!(r#"outbox_events{{event_type="{event_type}",state="{state}"}}"#)
    })
    .collect();
    // The relay drains the 30 events in one publish call, which may end
    // before the first scrape: then the store lists no open rows of either
    // type and the daemon has no series for them (a type gets its gauges
    // at its first backlog, and reads 0 once drained). Either is drained.
    scrape_until(&listen, |m| {
        gauge(m, published) == Some(30.0)
            && drained
                .iter()
                .all(|sample| gauge(m, sample).unwrap_or(0.0) == 0.0)
    })
    .await;
    assert!(
        curl(&format!("http://{listen}/health"))
            .await
            .contains("ok")
    );
    stop_with_sigterm(child).await;

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", unique("daemon-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    // Every partition of both topics from the start, without a group join.
    let mut partitions = TopicPartitionList::new();
    for topic in &topics {
        for partition in 0..2 {
            partitions
                .add_partition_offset(topic, partition, Offset::Beginning)
                .unwrap();
        }
    }
    consumer.assign(&partitions).unwrap();
    let mut read: Vec<(String, String, String)> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while read.len() < events.len() && std::time::Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message.unwrap();
            let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            let id = message
                .headers()
                .and_then(|h| {
                    use outbox_kafka::rdkafka::message::Headers as _;
                    h.iter()
                        .find(|h| h.key == "event_id")
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                })
                .expect("every message carries its event_id header");
            read.push((message.topic().to_owned(), key, id));
        }
    }
    assert_eq!(read.len(), events.len(), "each event once: {read:?}");
    for event in &events {
        let topic = format!("{prefix}{}", event.event_type);
        let expected: Vec<String> = events
            .iter()
            .filter(|e| e.partition_key == event.partition_key && e.event_type == event.event_type)
            .map(|e| e.event_id.to_string())
            .collect();
        let got: Vec<String> = read
            .iter()
            .filter(|(t, k, _)| *t == topic && *k == event.partition_key)
            .map(|(_, _, id)| id.clone())
            .collect();
        assert_eq!(
            got, expected,
            "{} on {topic} in enqueue order",
            event.partition_key
        );
    }
}

/// Scrapes `/metrics` until `done` holds (60 s at most); returns the text.
async fn scrape_until(listen: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        // Until the daemon listens, a refused connection is an empty scrape.
        let metrics = try_get(listen, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default();
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

/// `/metrics` parsed as Prometheus text, strictly: every line is a help or
/// type comment or a sample the parser understood (none skipped), every
/// `outbox_` family has `# HELP` and a `# TYPE`, and none is a summary
/// (summaries cannot be added up across replicas).
fn exposition(text: &str) -> prometheus_parse::Scrape {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let sample_lines = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .count();
    let parsed: usize = scrape
        .samples
        .iter()
        .map(|s| match &s.value {
            Value::Histogram(buckets) => buckets.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(parsed, sample_lines, "every sample line parses:\n{text}");
    let typed: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    for s in &scrape.samples {
        assert!(
            !matches!(s.value, Value::Summary(_)),
            "{} is a summary",
            s.metric
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                let base = s.metric.strip_suffix(suffix)?;
                typed.contains(base).then_some(base)
            })
            .unwrap_or(&s.metric);
        if family.starts_with("outbox_") {
            assert!(typed.contains(family), "# TYPE of {family}:\n{text}");
            assert!(
                scrape.docs.get(family).is_some_and(|d| !d.is_empty()),
                "# HELP of {family}:\n{text}"
            );
        }
    }
    scrape
}

/// The value of the sample `name` whose labels include `labels`.
fn sample<'a>(
    scrape: &'a prometheus_parse::Scrape,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a Value> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| &s.value)
}

/// The value of the sample `name` (with its labels) in Prometheus text.
fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}
