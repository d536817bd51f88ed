//! OpenTelemetry across the hop through Kafka: the span around the enqueue,
//! the relay's publish span and the consumer's handler span share one trace
//! (carried in the `traceparent` header).
//!
//! A binary of its own: the recorder is this thread's subscriber, and
//! under plain `cargo test`, with the other end-to-end tests running in the
//! same process, the consumer's spans were not recorded (alone, or under
//! nextest's process per test, they are). Kept apart until that is
//! understood.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::CancellationToken;
use outbox_core::testing::RelayFleet;
use outbox_core::testing::trace_recorder::{TraceRecorder, enqueue_in_span};
use outbox_kafka::{
    KafkaConsumer, KafkaConsumerConfig, KafkaPublisher, KafkaPublisherConfig, TopicRouter,
};
use outbox_sqlx::postgres::{EndToEndDb, RecordEffect};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

const DEADLINE: Duration = Duration::from_secs(90);

/// Current-thread runtime: the relay and consumer tasks report to the
/// recorder this thread installed.
#[tokio::test]
async fn one_trace_runs_from_the_enqueue_through_kafka_into_the_handler() {
    let recorder = TraceRecorder::install();
    let bootstrap =
        std::env::var("OUTBOX_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:19092".into());
    let db = EndToEndDb::create("kafka").await;
    let router = TopicRouter::with_prefix(format!(
        "trace{}.",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    let topic = router.topic_for("invoice.paid");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for created in admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap_or_else(|e| panic!("Kafka broker unreachable at {bootstrap}: {e}"))
    {
        created.unwrap();
    }

    enqueue_in_span(&*db.store, "pay_invoice").await;
    let publisher =
        KafkaPublisher::new(&KafkaPublisherConfig::new(&bootstrap), router.clone()).unwrap();
    let relays = RelayFleet::spawn(db.store.clone(), Arc::new(publisher), "kafka-relay", 1);
    let mut config = KafkaConsumerConfig::new(&bootstrap, format!("billing-{topic}"), vec![topic]);
    // The test broker settles a new group after about half the session
    // timeout (see the README).
    config
        .librdkafka
        .push(("session.timeout.ms".into(), "6000".into()));
    config
        .librdkafka
        .push(("heartbeat.interval.ms".into(), "500".into()));
    let consumer = KafkaConsumer::new(
        config,
        db.store.inbox(),
        RecordEffect {
            log: db.log.clone(),
        },
    )
    .unwrap();
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(consumer.run(stop.clone()));
    db.wait_for_effects(1, DEADLINE).await;
    relays.stop(DEADLINE).await;
    stop.cancel();
    assert_eq!(consumer.await.unwrap().unwrap().applied, 1);
    let trace = recorder.assert_one_trace("pay_invoice", "record_effect");
    println!("one trace from producer to handler: {trace}");
}
