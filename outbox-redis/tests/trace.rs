//! OpenTelemetry across the hop through Redis Streams: the span around the
//! enqueue, the relay's publish span and the consumer's handler span share
//! one trace (carried in the entry's `traceparent` field).
//!
//! A binary of its own, as Kafka's and SNS's: the recorder is this thread's
//! subscriber, and under plain `cargo test`, with the other end-to-end tests
//! running in the same process, the spans were not all recorded (alone, or
//! under nextest's process per test, they are).

mod support;

use support::consumer_config;

use std::sync::Arc;
use std::time::Duration;

use outbox_core::CancellationToken;
use outbox_core::testing::RelayFleet;
use outbox_core::testing::trace_recorder::{TraceRecorder, enqueue_in_span};
use outbox_redis::{RedisConsumer, RedisPublisher, StreamRouter};
use outbox_sqlx::postgres::{EndToEndDb, RecordEffect};

const DEADLINE: Duration = Duration::from_secs(60);

async fn database() -> EndToEndDb {
    EndToEndDb::create("e2e").await
}

/// OpenTelemetry across the hop: the span around the enqueue, the relay's
/// publish span and the consumer's handler span share one trace (carried in
/// the entry's `traceparent` field). Current-thread runtime: the relay and
/// consumer tasks report to the recorder this thread installed.
#[tokio::test]
async fn one_trace_runs_from_the_enqueue_through_redis_into_the_handler() {
    let recorder = TraceRecorder::install();
    let db = database().await;
    let prefix = support::prefix();
    enqueue_in_span(&*db.store, "pay_invoice").await;
    let publisher = Arc::new(RedisPublisher::new(
        support::connect(support::REDIS_URL).await,
        StreamRouter::with_prefix(&prefix),
    ));
    let relays = RelayFleet::spawn(db.store.clone(), publisher, "relay", 1);
    let consumer = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        consumer_config(&prefix, "c1"),
        db.store.inbox(),
        RecordEffect {
            log: db.log.clone(),
        },
    )
    .expect("valid consumer settings");
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(consumer.run(stop.clone()));
    db.wait_for_effects(1, DEADLINE).await;
    relays.stop(DEADLINE).await;
    stop.cancel();
    assert_eq!(consumer.await.unwrap().unwrap().applied, 1);
    let trace = recorder.assert_one_trace("pay_invoice", "record_effect");
    println!("one trace from producer to handler: {trace}");
}
