//! OpenTelemetry across the hop through SNS and SQS: the span around the
//! enqueue, the relay's publish span and the consumer's handler span share
//! one trace (carried in the `traceparent` message attribute).
//!
//! A binary of its own, as Kafka's (`outbox-kafka/tests/kafka_trace.rs`):
//! the recorder is this thread's subscriber, and under plain `cargo test`,
//! with the other end-to-end tests running in the same process, the
//! consumer's spans were not recorded (alone, or under nextest's process
//! per test, they are).

mod support;

use std::sync::Arc;

use outbox_core::testing::trace_recorder::{TraceRecorder, enqueue_in_span};
use support::end_to_end::*;

/// OpenTelemetry across the hop: the span around the enqueue, the relay's
/// publish span and the SQS consumer's handler span share one trace
/// (carried in the `traceparent` message attribute). Current-thread
/// runtime: the relay and consumer tasks report to this thread's recorder.
#[tokio::test]
async fn one_trace_runs_from_the_enqueue_through_sns_into_the_handler() {
    let recorder = TraceRecorder::install();
    let setup = setup(true, true).await;
    enqueue_in_span(&*setup.store, "pay_invoice").await;
    let relays = setup.relays(Arc::new(setup.publisher()), 1);
    let consumed = run_consumer_until(&setup, 1).await;
    relays.stop(DEADLINE).await;
    assert_eq!(consumed.applied, 1, "{consumed:?}");
    let trace = recorder.assert_one_trace("pay_invoice", "record_effect");
    println!("one trace from producer to handler: {trace}");
}
