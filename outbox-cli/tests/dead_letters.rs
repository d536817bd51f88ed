//! `outbox dead-letters list|show|replay` against the live Redis, Kafka
//! (tansu) and SQS emulator (moto) on loopback: dead letters written as
//! each adapter's consumer writes them, listed and shown, replayed once to
//! where the consumer reads (the second replay refused with exit status 1),
//! bad input refused with exit status 2.

use std::process::Output;
use std::time::Duration;

use outbox_kafka::rdkafka;
use outbox_sns::aws_sdk_sqs;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use redis::AsyncCommands;
use serde_json::Value;

fn unique(stem: &str) -> String {
    format!("{stem}{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

async fn outbox<S: AsRef<std::ffi::OsStr>>(args: &[S], env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
    command.args(args).env_remove("OUTBOX_URL");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().await.expect("the outbox binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn ok(output: &Output) -> String {
    assert!(output.status.success(), "{}", stderr(output));
    stdout(output)
}

/// `base` then `more`.
fn with(base: &[&str], more: &[&str]) -> Vec<String> {
    base.iter().chain(more).map(|s| (*s).to_owned()).collect()
}

/// List (JSON and text), show with and without the payload, replay, then
/// the same replay refused; returns the listed dead letter.
async fn list_show_replay_twice(base: &[&str], env: &[(&str, &str)], payload: &str) -> Value {
    let listed = ok(&outbox(&with(base, &["--output", "json", "list"]), env).await);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let [dead] = listed.as_array().unwrap().as_slice() else {
        panic!("one dead letter: {listed}");
    };
    assert_eq!(dead["error"], "amount is negative");
    assert_eq!(dead["event_type"], "invoice.paid");
    assert_eq!(dead["replayed"], Value::Null);
    assert!(dead.get("payload").is_none(), "no payload in a list");
    let id = dead["id"].as_str().unwrap().to_owned();
    let text = ok(&outbox(&with(base, &["list"]), env).await);
    assert!(
        text.contains(&id) && text.contains("amount is negative"),
        "{text}"
    );

    let shown = ok(&outbox(&with(base, &["show", &id]), env).await);
    assert!(shown.contains("amount is negative"), "{shown}");
    assert!(!shown.contains(payload), "payload only on request: {shown}");
    let shown = ok(&outbox(&with(base, &["show", &id, "--payload"]), env).await);
    assert!(shown.contains(payload), "{shown}");

    let unattributed = outbox(
        &with(base, &["replay", &id, "--reason", " ", "--operator", "ana"]),
        env,
    )
    .await;
    assert_eq!(
        unattributed.status.code(),
        Some(2),
        "{}",
        stderr(&unattributed)
    );
    let replayed = ok(&outbox(
        &with(
            base,
            &[
                "replay",
                &id,
                "--reason",
                "downstream fixed",
                "--operator",
                "ana",
            ],
        ),
        env,
    )
    .await);
    assert!(
        replayed.starts_with(&format!("replayed {id} as ")),
        "{replayed}"
    );
    let again = outbox(
        &with(
            base,
            &["replay", &id, "--reason", "again", "--operator", "bo"],
        ),
        env,
    )
    .await;
    assert_eq!(again.status.code(), Some(1), "refused: {}", stdout(&again));
    dead.clone()
}

#[tokio::test]
async fn redis_dead_letters_are_listed_shown_and_replayed_once() {
    let url = std::env::var("OUTBOX_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis unreachable at {url}: {e} (scripts/services.sh)"));
    let stream = format!("{}:invoice.paid", unique("cli-dl-"));
    let payload = r#"{"invoice":"in-7","amount":-5}"#;
    let _: String = redis
        .xadd(
            format!("{stream}:dead"),
            "*",
            &[
                ("event_id", "0191c2a4-0000-7000-8000-000000000007"),
                ("event_type", "invoice.paid"),
                ("partition_key", "in-7"),
                ("payload", payload),
                ("dlq.error", "amount is negative"),
                ("dlq.deliveries", "3"),
                ("dlq.stream", stream.as_str()),
                ("dlq.group", "billing"),
            ],
        )
        .await
        .unwrap();
    let base = [
        "dead-letters",
        "--broker",
        url.as_str(),
        "--source",
        stream.as_str(),
    ];
    let dead = list_show_replay_twice(&base, &[], payload).await;
    assert_eq!(dead["deliveries"], 3);

    let entries: redis::streams::StreamRangeReply = redis.xrange_all(&stream).await.unwrap();
    let [entry] = entries.ids.as_slice() else {
        panic!("replayed once: {entries:?}");
    };
    assert_eq!(entry.get::<String>("payload").as_deref(), Some(payload));
    assert!(
        entry.map.keys().all(|k| !k.starts_with("dlq.")),
        "{entry:?}"
    );
    let listed = ok(&outbox(&[&base[..], &["list"]].concat(), &[]).await);
    assert!(listed.contains("REPLAYED by ana"), "{listed}");
    let _: () = redis
        .del(&[
            stream.clone(),
            format!("{stream}:dead"),
            format!("{stream}:dead:replays"),
        ])
        .await
        .unwrap();

    let bad = outbox(
        &[
            "dead-letters",
            "--broker",
            "nats://x",
            "--source",
            "s",
            "list",
        ],
        &[],
    )
    .await;
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("expected redis://"),
        "{}",
        stderr(&bad)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_dead_letters_are_listed_shown_and_replayed_once() {
    let bootstrap =
        std::env::var("OUTBOX_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:19092".into());
    let topic = unique("cli-dl.");
    let client = || {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &bootstrap);
        config
    };
    let admin: AdminClient<DefaultClientContext> = client().create().unwrap();
    let created = admin
        .create_topics(
            &[
                NewTopic::new(&topic, 1, TopicReplication::Fixed(1)),
                NewTopic::new(&format!("{topic}.dlq"), 1, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap_or_else(|e| panic!("Kafka unreachable at {bootstrap}: {e} (scripts/kafka.sh)"));
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let payload = r#"{"invoice":"in-7","amount":-5}"#;
    let producer: FutureProducer = client().create().unwrap();
    let origin = format!("{topic}/0/41");
    let headers = [
        ("event_id", "0191c2a4-0000-7000-8000-000000000007"),
        ("event_type", "invoice.paid"),
        ("dlq.error", "amount is negative"),
        ("dlq.origin", origin.as_str()),
    ]
    .iter()
    .fold(OwnedHeaders::new(), |h, (key, value)| {
        h.insert(Header {
            key,
            value: Some(value.as_bytes()),
        })
    });
    producer
        .send(
            FutureRecord::to(&format!("{topic}.dlq"))
                .key("in-7")
                .payload(payload)
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let broker = format!("kafka://{bootstrap}");
    let base = [
        "dead-letters",
        "--broker",
        broker.as_str(),
        "--source",
        topic.as_str(),
    ];
    let dead = list_show_replay_twice(&base, &[], payload).await;
    assert_eq!(dead["id"], "0/0");
    assert_eq!(dead["partition_key"], "in-7");

    let reader: StreamConsumer = client()
        .set("group.id", unique("reader-"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    reader.subscribe(&[&topic]).unwrap();
    let message = tokio::time::timeout(Duration::from_secs(30), reader.recv())
        .await
        .expect("the replayed message")
        .unwrap();
    assert_eq!(message.key(), Some("in-7".as_bytes()));
    assert_eq!(message.payload(), Some(payload.as_bytes()));
    let names: Vec<&str> = message
        .headers()
        .into_iter()
        .flat_map(|h| h.iter().map(|h| h.key))
        .collect();
    assert!(names.contains(&"event_id"), "{names:?}");
    assert!(names.iter().all(|n| !n.starts_with("dlq.")), "{names:?}");
    let listed = ok(&outbox(&[&base[..], &["list"]].concat(), &[]).await);
    assert!(listed.contains("REPLAYED by ana"), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_dead_letters_are_listed_shown_and_replayed_once() {
    let endpoint =
        std::env::var("OUTBOX_SNS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into());
    let env = [
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
    ];
    let config = aws_sdk_sqs::config::Builder::new()
        .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
        .region(aws_sdk_sqs::config::Region::new("us-east-1"))
        .endpoint_url(&endpoint)
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "test", "test", None, None, "tests",
        ))
        .build();
    let sqs = aws_sdk_sqs::Client::from_conf(config);
    let create = async |name: String| {
        sqs.create_queue()
            .queue_name(name)
            .send()
            .await
            .unwrap_or_else(|e| {
                panic!("SQS emulator unreachable at {endpoint}: {e:?} (scripts/sns.sh)")
            })
            .queue_url
            .unwrap()
    };
    let source = create(unique("cli-src-")).await;
    let dlq = create(unique("cli-dlq-")).await;
    let payload = r#"{"invoice":"in-7","amount":-5}"#;
    let wrapper = serde_json::json!({
        "error": "amount is negative",
        "receive_count": 1,
        "source_queue": source,
        "message_id": "m-1",
        "group_id": null,
        "body": payload,
        "attributes": {
            "event_id": "0191c2a4-0000-7000-8000-000000000007",
            "event_type": "invoice.paid",
            "partition_key": "in-7",
        },
    });
    sqs.send_message()
        .queue_url(&dlq)
        .message_body(wrapper.to_string())
        .send()
        .await
        .unwrap();
    let base = ["dead-letters", "--broker", "sqs", "--source", dlq.as_str()];
    let dead = list_show_replay_twice(&base, &env, payload).await;
    assert_eq!(dead["source"], source.as_str());

    let received = sqs
        .receive_message()
        .queue_url(&source)
        .message_attribute_names("All")
        .wait_time_seconds(5)
        .send()
        .await
        .unwrap();
    let [message] = received.messages() else {
        panic!("replayed once: {received:?}");
    };
    assert_eq!(message.body(), Some(payload));
    let attribute = |name: &str| {
        message
            .message_attributes()
            .and_then(|a| a.get(name))
            .and_then(|v| v.string_value())
            .map(str::to_owned)
    };
    assert_eq!(attribute("event_type").as_deref(), Some("invoice.paid"));
    assert_eq!(attribute("dlq.replayed_by").as_deref(), Some("ana"));
    assert_eq!(
        attribute("dlq.replay_reason").as_deref(),
        Some("downstream fixed")
    );
    let listed = ok(&outbox(&[&base[..], &["list"]].concat(), &env).await);
    assert!(listed.starts_with("no dead letters"), "{listed}");

    let unset = outbox(
        &[&base[..], &["list"]].concat(),
        &[("AWS_REGION", ""), ("AWS_DEFAULT_REGION", "")],
    )
    .await;
    assert_eq!(unset.status.code(), Some(2), "{}", stderr(&unset));
    assert!(stderr(&unset).contains("AWS_REGION"), "{}", stderr(&unset));
}
