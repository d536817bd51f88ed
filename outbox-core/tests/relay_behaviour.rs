//! Relay behaviour beyond the conformance suites: how batches are shaped
//! into publish calls, wake-ups, rests, the lease guard and store-error
//! backoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::memory::{MemoryStore, MockPublisher, RecordingPublisher};
use outbox_core::relay::{BatchDone, Pace};
use outbox_core::store::{
    ClaimRequest, ClaimedBatch, EventState, OutboxAdmin, OutboxStore, OutboxWriter,
};
use outbox_core::testing::{Faulty, StoreFault, event, relay_suite};
use outbox_core::{
    CancellationToken, EventId, ManualClock, NewEvent, Ordering, PublishError,
    PublisherCapabilities, Relay, RelayConfig, StoreError,
};
use tokio::sync::Notify;

const DEADLINE: Duration = Duration::from_secs(30);

fn store() -> Arc<MemoryStore> {
    Arc::new(MemoryStore::with_clock(Arc::new(ManualClock::at_epoch())))
}

async fn enqueue(store: &MemoryStore, events: &[NewEvent]) {
    store.enqueue(events).await.unwrap();
}

fn ids(events: &[outbox_core::StoredEvent]) -> Vec<EventId> {
    events.iter().map(|e| e.event_id).collect()
}

/// a1 a2 a3 b1 claimed together, as the publish calls they become.
async fn calls_for(config: RelayConfig, capabilities: PublisherCapabilities) -> Vec<Vec<EventId>> {
    let store = store();
    let batch = [event("a", 1), event("a", 2), event("a", 3), event("b", 1)];
    enqueue(&store, &batch).await;
    let (mock, handle) = MockPublisher::pair();
    let relay = Relay::new(
        store,
        Arc::new(mock.with_capabilities(capabilities)),
        config,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    let task = relay.spawn(shutdown.clone());
    let mut calls = Vec::new();
    let mut seen = 0;
    while seen < batch.len() {
        let call = tokio::time::timeout(DEADLINE, handle.next_call())
            .await
            .unwrap();
        seen += call.events.len();
        calls.push(ids(&call.events));
        call.succeed_all();
    }
    shutdown.cancel();
    assert_eq!(task.await.unwrap().unwrap().published, 4);
    let id = |i: usize| batch[i].event_id;
    assert!(calls.concat().iter().all(|e| (0..4).any(|i| id(i) == *e)));
    calls
}

#[tokio::test]
async fn per_key_mode_sends_one_event_per_key_per_call() {
    let calls = calls_for(
        relay_suite::config("waves"),
        PublisherCapabilities::default(),
    )
    .await;
    assert_eq!(
        calls.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![2, 1, 1]
    );
}

#[tokio::test]
async fn an_order_keeping_publisher_gets_the_whole_batch_at_once() {
    let caps = PublisherCapabilities {
        max_batch: 100,
        preserves_key_order: true,
    };
    let calls = calls_for(relay_suite::config("one-call"), caps).await;
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].len(), 4);
}

/// An order-keeping publisher fails a key's head and holds back the key's
/// later events in the same call: only the head spends an attempt. Were the
/// held events nacked too, a head failing N times would exhaust the attempts
/// of followers that were never tried.
#[tokio::test]
async fn events_held_behind_their_keys_failure_burn_no_attempt() {
    let store = store();
    let batch = [event("a", 1), event("a", 2), event("a", 3), event("b", 1)];
    enqueue(&store, &batch).await;
    let (mock, handle) = MockPublisher::pair();
    let caps = PublisherCapabilities {
        max_batch: 100,
        preserves_key_order: true,
    };
    let shutdown = CancellationToken::new();
    let task = Relay::new(
        store.clone(),
        Arc::new(mock.with_capabilities(caps)),
        relay_suite::config("held"),
    )
    .unwrap()
    .spawn(shutdown.clone());
    let call = tokio::time::timeout(DEADLINE, handle.next_call())
        .await
        .unwrap();
    assert_eq!(call.events.len(), 4, "one call for the whole batch");
    let outcomes = call
        .events
        .iter()
        .map(|e| match e.event_id {
            id if id == batch[0].event_id => Err(PublishError::transient("broker said no")),
            id if id == batch[3].event_id => Ok(()),
            _ => Err(PublishError::transient(
                "held: an earlier event of the key failed",
            )),
        })
        .collect();
    call.respond(outcomes);
    shutdown.cancel();
    let report = task.await.unwrap().unwrap();
    assert_eq!((report.published, report.retried), (1, 1), "{report:?}");
    assert_eq!(store.history(batch[0].event_id).await.unwrap().len(), 1);
    for e in &batch[1..3] {
        let history = store.history(e.event_id).await.unwrap();
        assert!(
            history.is_empty(),
            "a held event burned an attempt: {history:?}"
        );
    }
}

#[tokio::test]
async fn unordered_mode_fills_calls_up_to_max_batch() {
    let mut config = relay_suite::config("unordered");
    config.ordering = Ordering::Unordered;
    let caps = PublisherCapabilities {
        max_batch: 3,
        preserves_key_order: false,
    };
    let calls = calls_for(config, caps).await;
    assert_eq!(calls.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 1]);
}

#[tokio::test]
async fn a_wake_up_hint_ends_the_idle_wait() {
    let inner = MemoryStore::with_clock(Arc::new(ManualClock::at_epoch()));
    let store = InstrumentedClaims::wrap(inner.clone(), 0);
    let publisher = Arc::new(RecordingPublisher::new());
    let mut config = relay_suite::config("sleepy");
    config.poll_interval = Duration::from_secs(3600);
    let relay = Relay::new(store.clone(), publisher.clone(), config)
        .unwrap()
        .with_wake_up(inner.wake_up());
    let shutdown = CancellationToken::new();
    let task = relay.spawn(shutdown.clone());
    // The first claim finds nothing, so the relay idles on an hour-long
    // poll: only the hint can bring it back within the deadline.
    tokio::time::timeout(DEADLINE, store.wait_for_claims(1))
        .await
        .unwrap();
    enqueue(&inner, &[event("a", 1)]).await;
    tokio::time::timeout(DEADLINE, publisher.wait_for_deliveries(1))
        .await
        .expect("woken by the hint, not the hour-long poll");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_lease_too_short_for_another_attempt_is_released_unstarted() {
    let store = store();
    let (a1, a2) = (event("a", 1), event("a", 2));
    enqueue(&store, &[a1.clone(), a2.clone()]).await;
    let (mock, handle) = MockPublisher::pair();
    let mut config = relay_suite::config("late");
    config.lease_duration = Duration::from_secs(10);
    config.publish_timeout = Duration::from_secs(5);
    let shutdown = CancellationToken::new();
    let task = Relay::new(store.clone(), Arc::new(mock), config)
        .unwrap()
        .spawn(shutdown.clone());
    let first = handle.next_call().await;
    assert_eq!(ids(&first.events), vec![a1.event_id]);
    // 6 s into a 10 s lease, a 5 s attempt could outlive it.
    tokio::time::advance(Duration::from_secs(6)).await;
    first.succeed_all();
    let second = handle.next_call().await;
    assert_eq!(
        ids(&second.events),
        vec![a2.event_id],
        "a2 comes back in a fresh claim"
    );
    second.succeed_all();
    shutdown.cancel();
    let report = task.await.unwrap().unwrap();
    assert_eq!((report.published, report.released), (2, 1));
    let history = store.history(a2.event_id).await.unwrap();
    assert!(history.is_empty(), "the release burned no attempt");
}

/// A memory store's fault that counts claims (and can fail the first few
/// with a retryable error), so tests can wait for "the relay has claimed".
struct InstrumentedClaims {
    failures_left: AtomicUsize,
    claims: AtomicUsize,
    claimed: Notify,
}

type InstrumentedStore = Faulty<MemoryStore, InstrumentedClaims>;

impl InstrumentedClaims {
    fn wrap(inner: MemoryStore, failures: usize) -> Arc<InstrumentedStore> {
        let fault = Self {
            failures_left: AtomicUsize::new(failures),
            claims: AtomicUsize::new(0),
            claimed: Notify::new(),
        };
        Arc::new(Faulty::wrap(inner, fault))
    }

    async fn wait_for_claims(&self, n: usize) {
        loop {
            let notified = self.claimed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.claims.load(AtomicOrdering::SeqCst) >= n {
                return;
            }
            notified.await;
        }
    }
}

#[async_trait]
impl StoreFault<MemoryStore> for InstrumentedClaims {
    async fn claim_batch(
        &self,
        inner: &MemoryStore,
        request: &ClaimRequest,
    ) -> Result<ClaimedBatch, StoreError> {
        let left = self.failures_left.load(AtomicOrdering::SeqCst);
        let result = if left > 0 {
            self.failures_left.store(left - 1, AtomicOrdering::SeqCst);
            Err(StoreError::Unavailable(
                "connection reset (injected)".into(),
            ))
        } else {
            inner.claim_batch(request).await
        };
        self.claims.fetch_add(1, AtomicOrdering::SeqCst);
        self.claimed.notify_waiters();
        result
    }
}

#[tokio::test]
async fn store_errors_back_off_and_recover() {
    let inner = MemoryStore::with_clock(Arc::new(ManualClock::at_epoch()));
    let e = event("a", 1);
    enqueue(&inner, std::slice::from_ref(&e)).await;
    let store = InstrumentedClaims::wrap(inner.clone(), 3);
    let publisher = Arc::new(RecordingPublisher::new());
    let shutdown = CancellationToken::new();
    let task = Relay::new(store, publisher.clone(), relay_suite::config("flaky"))
        .unwrap()
        .spawn(shutdown.clone());
    tokio::time::timeout(DEADLINE, publisher.wait_for_deliveries(1))
        .await
        .unwrap();
    shutdown.cancel();
    let report = task.await.unwrap().unwrap();
    assert_eq!((report.store_errors, report.published), (3, 1));
    assert!(matches!(
        inner.event_state(e.event_id).await.unwrap(),
        Some(EventState::Published { .. })
    ));
}

#[test]
fn invalid_settings_are_refused_before_running() {
    let mut config = RelayConfig::default();
    config.publish_timeout = config.lease_duration * 2;
    let err = Relay::new(store(), Arc::new(RecordingPublisher::new()), config)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("publish_timeout"));
}

/// Records the batches it is told of and rests `rest` after each full one.
struct RestAfterFull {
    rest: Duration,
    seen: Arc<std::sync::Mutex<Vec<(usize, bool)>>>,
}

impl Pace for RestAfterFull {
    fn rest_after(&self, batch: &BatchDone) -> Duration {
        self.seen.lock().unwrap().push((batch.events, batch.full));
        if batch.full {
            self.rest
        } else {
            Duration::ZERO
        }
    }
}

/// A fleet slows a backlogged tenant through its relay's pace: the relay
/// tells it every settled batch and waits the rest it returns before its
/// next claim.
#[tokio::test(start_paused = true)]
async fn a_relay_rests_between_batches_as_its_pace_says() {
    let store = store();
    let events: Vec<NewEvent> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|key| event(key, 1))
        .collect();
    enqueue(&store, &events).await;
    let publisher = Arc::new(RecordingPublisher::new());
    let mut config = relay_suite::config("paced");
    config.batch_size = 2;
    config.prefetch = false;
    let seen = Arc::default();
    let rest = Duration::from_secs(5);
    let relay = Relay::new(store.clone(), publisher.clone(), config)
        .unwrap()
        .with_pace(RestAfterFull {
            rest,
            seen: Arc::clone(&seen),
        });
    let started = tokio::time::Instant::now();
    let shutdown = CancellationToken::new();
    let task = relay.spawn(shutdown.clone());
    tokio::time::timeout(DEADLINE, publisher.wait_for_deliveries(5))
        .await
        .unwrap();
    let took = started.elapsed();
    shutdown.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        &[(2, true), (2, true), (1, false)],
        "told of every batch, full or not"
    );
    assert!(
        took >= 2 * rest && took < 3 * rest,
        "rested after the two full batches only: {took:?}"
    );
}
