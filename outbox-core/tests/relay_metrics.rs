//! The relay reports through the `metrics` facade. Own test binary: the
//! debugging recorder is installed process-wide.

use std::sync::Arc;
use std::time::Duration;

use std::sync::OnceLock;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use outbox_core::memory::{Fault, MemoryStore, RecordingPublisher};
use outbox_core::relay::metrics as names;
use outbox_core::store::OutboxWriter;
use outbox_core::testing::{event, relay_suite};
use outbox_core::{CancellationToken, ErrorClass, ManualClock, Publisher, Relay};

/// The process-wide recorder, installed by the first test to ask.
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("first recorder in this process");
        snapshotter
    })
}

#[tokio::test]
async fn relay_counts_published_retried_failed_and_times_calls() {
    let snapshotter = snapshotter();

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
        if !key.key().labels().any(|l| l.value() == "metered") {
            continue;
        }
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

/// `outbox_publisher_outage{destination}` is 0 from the relay's start (an
/// alert rule needs the series before the first outage), 1 while the
/// publisher reports an outage, and 0 again once publishing works.
#[tokio::test]
async fn the_outage_gauge_follows_the_publisher() {
    let snapshotter = snapshotter();
    let publisher = Arc::new(RecordingPublisher::new());
    let destination = publisher.destination();
    let outage_gauge = || {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find_map(|(key, _, _, value)| {
                let key = key.key();
                let ours = key.name() == names::PUBLISHER_OUTAGE
                    && key
                        .labels()
                        .any(|l| l.key() == "destination" && l.value() == destination);
                match value {
                    DebugValue::Gauge(v) if ours => Some(v.into_inner()),
                    _ => None,
                }
            })
    };
    let wait_for = |expected: f64| async move {
        tokio::time::timeout(Duration::from_secs(30), async {
            while outage_gauge() != Some(expected) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("gauge never read {expected}: {:?}", outage_gauge()));
    };
    let store = Arc::new(MemoryStore::with_clock(Arc::new(ManualClock::at_epoch())));
    let shutdown = CancellationToken::new();
    let task = Relay::new(
        store.clone(),
        publisher.clone(),
        relay_suite::config("gauged"),
    )
    .unwrap()
    .spawn(shutdown.clone());
    wait_for(0.0).await;
    publisher.set_outage(true);
    store.enqueue(&[event("a", 1)]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), publisher.wait_for_calls(2))
        .await
        .unwrap();
    wait_for(1.0).await;
    publisher.set_outage(false);
    tokio::time::timeout(Duration::from_secs(30), publisher.wait_for_deliveries(1))
        .await
        .unwrap();
    wait_for(0.0).await;
    shutdown.cancel();
    task.await.unwrap().unwrap();
}
