//! The relay reports through the `metrics` facade. Own test binary: the
//! debugging recorder is installed process-wide.

use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use outbox_core::memory::{Fault, MemoryStore, RecordingPublisher};
use outbox_core::relay::metrics as names;
use outbox_core::store::OutboxWriter;
use outbox_core::testing::{event, relay_suite};
use outbox_core::{CancellationToken, ErrorClass, ManualClock, Relay};

#[tokio::test]
async fn relay_counts_published_retried_failed_and_times_calls() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("first recorder in this process");

    let store = Arc::new(MemoryStore::with_clock(Arc::new(ManualClock::at_epoch())));
    let (ok, flaky, poison) = (event("a", 1), event("b", 1), event("c", 1));
    store
        .enqueue(&[ok, flaky.clone(), poison.clone()])
        .await
        .unwrap();
    let publisher = Arc::new(RecordingPublisher::new());
    publisher.inject(flaky.event_id, Fault::FailTimes(ErrorClass::Transient, 1));
    publisher.inject(poison.event_id, Fault::FailAlways(ErrorClass::Permanent));
    let shutdown = CancellationToken::new();
    let task = Relay::new(store, publisher.clone(), relay_suite::config("metered"))
        .unwrap()
        .with_alert_hook(|_: &outbox_core::relay::FailedAlert| {})
        .spawn(shutdown.clone());
    tokio::time::timeout(Duration::from_secs(30), publisher.wait_for_deliveries(2))
        .await
        .unwrap();
    shutdown.cancel();
    task.await.unwrap().unwrap();

    let mut counters = std::collections::HashMap::new();
    let mut histograms = std::collections::HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        match value {
            DebugValue::Counter(n) => *counters.entry(name).or_insert(0) += n,
            DebugValue::Histogram(samples) => {
                *histograms.entry(name).or_insert(0) += samples.len();
            }
            DebugValue::Gauge(_) => {}
        }
    }
    assert_eq!(counters.get(names::PUBLISHED), Some(&2), "{counters:?}");
    assert_eq!(counters.get(names::RETRIED), Some(&1), "{counters:?}");
    assert_eq!(counters.get(names::FAILED), Some(&1), "{counters:?}");
    assert!(histograms.get(names::PUBLISH_SECONDS).copied().unwrap_or(0) >= 2);
    assert!(histograms.get(names::CLAIM_SECONDS).copied().unwrap_or(0) >= 1);
}
