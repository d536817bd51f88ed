//! A publisher outage seen from outside the daemon: status, health and
//! `/metrics` show it while it lasts and clear once it ends, for Redis,
//! Kafka and SNS.

use super::*;

/// Runs `outbox <args>` against the daemon's store: (exit code, stdout,
/// stderr).
pub(super) async fn operator(
    url: &str,
    schema: &str,
    args: &[&str],
) -> (Option<i32>, String, String) {
    let output = daemon_command()
        .args(["--url", url, "--schema", schema])
        .args(args)
        .output()
        .await
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// While the daemon is paused by a broker outage, every place an operator
/// looks says so, naming the destination and the broker's error: `status`
/// (held back, and the relay's line), `health` (exit 4, "degraded: …"),
/// `/health` (200 "degraded: …", then 503 once the outage outlasts
/// `outage_unhealthy_after`) and the `outbox_publisher_outage` gauge. Then
/// `fix` removes the cause and all of it clears within the outage pause.
pub(super) async fn outage_is_visible_then_clears(
    url: &str,
    schema: &str,
    listen: &str,
    destination: &str,
    reason: &str,
    fix: impl std::future::Future<Output = ()>,
) {
    let outage_gauge = format!(r#"outbox_publisher_outage{{destination="{destination}"}}"#);
    scrape_until(listen, |m| gauge(m, &outage_gauge) == Some(1.0)).await;

    let (code, status, _) = operator(url, schema, &["status"]).await;
    assert_eq!(code, Some(0), "{status}");
    let held_back = format!("held back: publishing to {destination} paused since");
    assert!(status.contains(&held_back), "{status}");
    assert!(status.contains(reason), "{status}");
    assert!(status.contains("PAUSED since"), "{status}");
    assert!(!status.contains("held back: nothing"), "{status}");

    let (code, _, why) = operator(url, schema, &["health", "--max-age", "1h"]).await;
    assert_eq!(code, Some(4), "degraded has its own exit status: {why}");
    assert!(
        why.starts_with(&format!("outbox: degraded: publishing to {destination}")),
        "{why}"
    );
    assert!(why.contains(reason), "{why}");
    let (code, json, _) = operator(
        url,
        schema,
        &["--output", "json", "health", "--max-age", "1h"],
    )
    .await;
    assert_eq!(code, Some(4));
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        (json["healthy"].as_bool(), json["degraded"].as_bool()),
        (Some(false), Some(true))
    );

    // 200 while the outage is younger than outage_unhealthy_after (2 s),
    // 503 after: read until the 503.
    let (first, body) = get(listen, "/health").await;
    assert!(
        body.starts_with("degraded: publishing to"),
        "{first} {body}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (line, body) = get(listen, "/health").await;
        assert!(body.contains(reason), "{line}: {body}");
        if line == "HTTP/1.1 503 Service Unavailable" {
            break;
        }
        assert_eq!(line, "HTTP/1.1 200 OK");
        assert!(
            tokio::time::Instant::now() < deadline,
            "/health never turned 503"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    fix.await;
    scrape_until(listen, |m| gauge(m, &outage_gauge) == Some(0.0)).await;
    let (line, body) = get(listen, "/health").await;
    assert_eq!((line.as_str(), body.as_str()), ("HTTP/1.1 200 OK", "ok\n"));
    let (code, status, _) = operator(url, schema, &["status"]).await;
    assert_eq!(code, Some(0), "{status}");
    assert!(!status.contains("PAUSED"), "{status}");
    assert!(!status.contains("publishing to"), "{status}");
    let (code, out, why) = operator(url, schema, &["health", "--max-age", "1h"]).await;
    assert_eq!(code, Some(0), "{out}{why}");
}

/// A Redis stream key holding a string (WRONGTYPE): the daemon pauses, and
/// the outage is visible everywhere until the key is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_redis_outage_shows_in_status_health_and_metrics_then_clears() {
    let db = EndToEndDb::create("daemon_outage").await;
    let events = billing_events(3);
    OutboxWriter::enqueue(&*db.store, &events).await.unwrap();
    let prefix = format!("{}:", unique("wrongtype"));
    let client = redis::Client::open(redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let poisoned = format!("{prefix}payment.failed");
    let _: () = redis::cmd("SET")
        .arg(&poisoned)
        .arg("not a stream")
        .query_async(&mut redis)
        .await
        .unwrap();
    let listen = free_address();
    let url = pg_url();
    let config = ConfigFile::for_outage(
        &db.schema,
        "daemon-wrongtype",
        &listen,
        &format!(
            r#"
[broker]
kind = "redis"
url = "{redis}"
stream_prefix = "{prefix}"
"#,
            redis = redis_url(),
        ),
    );
    let child = spawn_daemon(&config);
    let address = redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let destination = format!("redis {address} streams {prefix}<event type>");
    let fix = async {
        let _: () = redis::cmd("DEL")
            .arg(&poisoned)
            .query_async(&mut redis.clone())
            .await
            .unwrap();
    };
    outage_is_visible_then_clears(&url, &db.schema, &listen, &destination, "WRONGTYPE", fix).await;
    let published = r#"outbox_relay_published_total{relay="daemon-wrongtype"}"#;
    scrape_until(&listen, |m| gauge(m, published) == Some(9.0)).await;
    stop_with_sigterm(child).await;
    for event_type in ["payment.failed", "invoice.paid"] {
        let _: () = redis::cmd("DEL")
            .arg(format!("{prefix}{event_type}"))
            .query_async(&mut redis)
            .await
            .unwrap();
    }
}

/// A Kafka topic that does not exist (auto-create off): the daemon pauses,
/// and the outage is visible everywhere until the topic is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_missing_kafka_topic_shows_in_status_health_and_metrics_then_clears() {
    use outbox_kafka::rdkafka::ClientConfig;
    use outbox_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use outbox_kafka::rdkafka::client::DefaultClientContext;

    let db = EndToEndDb::create("daemon_outage").await;
    let events = billing_events(3);
    OutboxWriter::enqueue(&*db.store, &events).await.unwrap();
    let prefix = format!("{}.", unique("missing"));
    let bootstrap = kafka_bootstrap();
    // One topic exists, the other not: the relay pauses on the missing one.
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let create = |topic: String| {
        let admin = &admin;
        async move {
            for created in admin
                .create_topics(
                    &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
                    &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
                )
                .await
                .unwrap_or_else(|e| panic!("Kafka broker unreachable: {e}"))
            {
                created.unwrap();
            }
        }
    };
    create(format!("{prefix}invoice.paid")).await;
    let listen = free_address();
    let url = pg_url();
    let config = ConfigFile::for_outage(
        &db.schema,
        "daemon-missing-topic",
        &listen,
        &format!(
            r#"
[broker]
kind = "kafka"
bootstrap = "{bootstrap}"
topic_prefix = "{prefix}"
delivery_timeout = "2s"

[broker.settings]
"allow.auto.create.topics" = "false"
"#
        ),
    );
    let child = spawn_daemon(&config);
    let destination = format!("kafka {bootstrap} topics {prefix}<event type>");
    outage_is_visible_then_clears(
        &url,
        &db.schema,
        &listen,
        &destination,
        "topic",
        create(format!("{prefix}payment.failed")),
    )
    .await;
    let published = r#"outbox_relay_published_total{relay="daemon-missing-topic"}"#;
    scrape_until(&listen, |m| gauge(m, published) == Some(9.0)).await;
    stop_with_sigterm(child).await;
}

/// SNS through the daemon (`kind = "sns"`, credentials from the
/// environment) behind a proxy that is cut: the unreachable endpoint shows
/// in `status`, `health`, `/health` and the gauge, then clears when the
/// endpoint answers again, and every event is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn an_unreachable_sns_endpoint_shows_in_status_health_and_metrics_then_clears() {
    use outbox_sns::aws_sdk_sns;

    let endpoint =
        std::env::var("OUTBOX_SNS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into());
    let sns = aws_sdk_sns::Client::from_conf(
        aws_sdk_sns::config::Builder::new()
            .behavior_version(aws_sdk_sns::config::BehaviorVersion::latest())
            .region(aws_sdk_sns::config::Region::new("us-east-1"))
            .endpoint_url(&endpoint)
            .credentials_provider(aws_sdk_sns::config::Credentials::new(
                "test", "test", None, None, "tests",
            ))
            .build(),
    );
    let topic_arn = sns
        .create_topic()
        .name(unique("daemon-sns"))
        .send()
        .await
        .unwrap_or_else(|e| {
            panic!("SNS emulator unreachable at {endpoint}: {e:?} (scripts/sns.sh)")
        })
        .topic_arn
        .unwrap();
    let upstream: std::net::SocketAddr = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let proxy = CuttableProxy::start(
        upstream,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    )
    .unwrap();
    proxy.cut();

    let db = EndToEndDb::create("daemon_sns").await;
    OutboxWriter::enqueue(&*db.store, &billing_events(3))
        .await
        .unwrap();
    let listen = free_address();
    let url = pg_url();
    let config = ConfigFile::for_outage(
        &db.schema,
        "daemon-sns",
        &listen,
        &format!(
            r#"
[broker]
kind = "sns"
topic_arn = "{topic_arn}"
region = "us-east-1"
endpoint = "http://{proxy}"
"#,
            proxy = proxy.address(),
        ),
    );
    let child = daemon_command()
        .args(["relay", "--config"])
        .arg(&config.0)
        .envs([
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
        ])
        .spawn()
        .unwrap();
    let destination = format!("sns {topic_arn}");
    outage_is_visible_then_clears(&url, &db.schema, &listen, &destination, "dispatch", async {
        proxy.restore();
    })
    .await;
    let published = r#"outbox_relay_published_total{relay="daemon-sns"}"#;
    scrape_until(&listen, |m| gauge(m, published) == Some(9.0)).await;
    stop_with_sigterm(child).await;
}
