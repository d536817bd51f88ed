//! The relay suite: the relay over a store, with every duplicate window of
//! the design as an injected fault.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::fixtures::{event, events_over_keys};
use super::store_suite::LEASE;
use super::{Faulty, MemoryInboxHarness, StoreFactory, StoreFault, enqueue_all, inbox_suite};
use crate::clock::ManualClock;
use crate::error::StoreError;
use crate::event::{EventId, NewEvent, StoredEvent};
use crate::memory::{Fault, MockPublisher, RecordingPublisher};
use crate::policy::{FixedRandom, PoisonPolicy, RetryPolicy};
use crate::publisher::{ErrorClass, Publisher, PublisherCapabilities};
use crate::relay::{
    FailedAlert, FailureCause, OutagePolicy, Relay, RelayConfig, RelayError, RelayHealth,
    RelayReport,
};
use crate::store::{
    AttemptKind, ClaimRequest, ClaimedBatch, EventState, OutboxAdmin, OutboxStore, RelayId,
};

mod failures;
pub use failures::*;

/// How long any single wait in this suite may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {DEADLINE:?} waiting for {what}"))
}

/// The relay settings the suite uses: small batches, fast polling, immediate
/// retries, the store suite's lease.
pub fn config(name: &str) -> RelayConfig {
    RelayConfig {
        relay_id: RelayId::new(name),
        batch_size: 16,
        lease_duration: LEASE,
        publish_timeout: Duration::from_secs(5),
        poll_interval: Duration::from_millis(5),
        retry: RetryPolicy::immediate(5),
        outage: OutagePolicy {
            initial_pause: Duration::from_millis(5),
            max_pause: Duration::from_millis(20),
        },
        crash_loop_limit: 3,
        drain_timeout: Duration::from_secs(5),
        heartbeat_interval: Duration::from_secs(1),
        ..RelayConfig::default()
    }
}

/// Collects alerts and lets a test wait for them.
#[derive(Clone, Default)]
pub(crate) struct Alerts(Arc<(Mutex<Vec<FailedAlert>>, Notify)>);

impl Alerts {
    pub(crate) fn hook(&self) -> impl Fn(&FailedAlert) + Send + Sync + 'static {
        let inner = self.0.clone();
        move |alert: &FailedAlert| {
            inner.0.lock().expect("alerts").push(alert.clone());
            inner.1.notify_waiters();
        }
    }
    fn taken(&self) -> Vec<FailedAlert> {
        self.0.0.lock().expect("alerts").clone()
    }
    pub(crate) async fn wait_for(&self, n: usize) {
        loop {
            let notified = self.0.1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0.0.lock().expect("alerts").len() >= n {
                return;
            }
            notified.await;
        }
    }
}

pub(crate) struct Running {
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<Result<RelayReport, RelayError>>,
    health: RelayHealth,
}

impl Running {
    pub(crate) async fn stop(self) -> RelayReport {
        self.shutdown.cancel();
        within("relay shutdown", self.handle)
            .await
            .expect("relay task")
            .expect("the relay stops only when asked")
    }

    /// Kills the relay task where it stands: no settlement, no release.
    pub(crate) async fn crash(self) {
        self.handle.abort();
        let _ = self.handle.await;
    }
}

pub(crate) fn start<S, P>(
    store: Arc<S>,
    publisher: Arc<P>,
    config: RelayConfig,
    alerts: Option<&Alerts>,
) -> Running
where
    S: OutboxStore + 'static,
    P: Publisher + 'static,
{
    let mut relay = Relay::new(store, publisher, config)
        .expect("valid config")
        .with_random(FixedRandom(0.5));
    if let Some(alerts) = alerts {
        relay = relay.with_alert_hook(alerts.hook());
    }
    let shutdown = CancellationToken::new();
    let health = relay.health();
    let handle = relay.spawn(shutdown.clone());
    Running {
        shutdown,
        handle,
        health,
    }
}

fn by_key(delivered: &[StoredEvent]) -> HashMap<String, Vec<EventId>> {
    let mut keys: HashMap<String, Vec<EventId>> = HashMap::new();
    for e in delivered {
        keys.entry(e.partition_key.clone())
            .or_default()
            .push(e.event_id);
    }
    keys
}

fn expected_by_key(events: &[NewEvent]) -> HashMap<String, Vec<EventId>> {
    let mut keys: HashMap<String, Vec<EventId>> = HashMap::new();
    for e in events {
        keys.entry(e.partition_key.clone())
            .or_default()
            .push(e.event_id);
    }
    keys
}

async fn state<S: OutboxAdmin + ?Sized>(store: &S, id: EventId) -> EventState {
    store
        .event_state(id)
        .await
        .expect("event_state")
        .expect("event exists")
}

/// Four relays, 1,000 events over 50 keys, injected transient failures:
/// everything is published once, each key in enqueue order.
pub async fn per_key_order_with_four_relays<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let events = events_over_keys(1000, 50);
    enqueue_all(&*store, &events).await;
    let publisher = Arc::new(RecordingPublisher::new());
    let mut injected = 0;
    for (n, e) in events.iter().enumerate() {
        if n % 7 == 0 {
            publisher.inject(e.event_id, Fault::FailTimes(ErrorClass::Transient, 2));
            injected += 2;
        } else if n % 11 == 0 {
            publisher.inject(e.event_id, Fault::FailTimes(ErrorClass::Transient, 1));
            injected += 1;
        }
    }
    // Store time follows the database clock here: a minute's lease so a
    // machine loaded by other tests cannot expire one (a relay stalled past
    // its lease is re-claimed and published twice, as promised).
    let relays: Vec<Running> = (0..4)
        .map(|r| {
            let config = RelayConfig {
                lease_duration: Duration::from_secs(60),
                ..config(&format!("relay-{r}"))
            };
            start(store.clone(), publisher.clone(), config, None)
        })
        .collect();
    within("1,000 deliveries", publisher.wait_for_deliveries(1000)).await;
    let mut total = RelayReport::default();
    for relay in relays {
        let report = relay.stop().await;
        assert!(report.drained);
        total.published += report.published;
        total.retried += report.retried;
        total.fenced += report.fenced;
    }
    let delivered = publisher.delivered();
    assert_eq!(
        (delivered.len(), total.fenced),
        (1000, 0),
        "no duplicates and nothing fenced: with no lease expired, a duplicate is a store bug"
    );
    assert_eq!(
        by_key(&delivered),
        expected_by_key(&events),
        "per-key order"
    );
    assert_eq!(
        (total.published, total.retried, total.fenced),
        (1000, injected, 0)
    );
    for s in store.stats().await.unwrap() {
        assert_eq!(
            (s.claimable, s.in_flight, s.parked, s.failed),
            (0, 0, 0, 0),
            "{s:?}"
        );
    }
}

/// A backlog on one key, then on three, drains without a single idle wait:
/// the claim made while a batch is in flight finds every key with pending
/// events leased by that batch, which is work behind the relay's own
/// leases, not an idle store. The poll interval is an hour, so one idle
/// wait fails the test.
pub async fn few_keys_drain_without_idle_waits<F: StoreFactory>(factory: &F) {
    for keys in [1, 3] {
        let store = factory.create(ManualClock::at_epoch()).await;
        let relay_config = RelayConfig {
            poll_interval: Duration::from_secs(3600),
            ..config(&format!("relay-few-keys-{keys}"))
        };
        let batches = 3;
        let events = events_over_keys(relay_config.batch_size * batches, keys);
        enqueue_all(&*store, &events).await;
        let claims = Arc::new(CountClaims::wrap(store.clone()));
        // One call per batch: the publisher keeps key order within a call.
        let (mock, handle) = MockPublisher::pair();
        let mock = mock.with_capabilities(PublisherCapabilities {
            max_batch: relay_config.batch_size,
            preserves_key_order: true,
        });
        let relay = start(claims.clone(), Arc::new(mock), relay_config, None);
        let mut delivered = Vec::new();
        for batch in 1..=batches {
            let call = within("the next batch, with no idle wait", handle.next_call()).await;
            if batch == 1 {
                // The claim made while the first batch is in flight has
                // returned (empty: every key is in this batch) before the
                // batch settles. (After an empty one the relay may skip
                // such claims for a while; either way it must not idle.)
                within("the claim beside the batch", claims.wait_for(2)).await;
            }
            delivered.extend(call.events.iter().cloned());
            call.succeed_all();
        }
        let report = relay.stop().await;
        assert_eq!(report.published, events.len() as u64);
        assert_eq!(
            by_key(&delivered),
            expected_by_key(&events),
            "per-key order"
        );
    }
}

/// A store that counts the claims it has answered.
/// Counts the claims a store has answered, so a test can wait for one.
struct CountClaims {
    answered: tokio::sync::watch::Sender<usize>,
}

impl CountClaims {
    fn wrap<S>(inner: Arc<S>) -> Faulty<Arc<S>, Self> {
        let answered = tokio::sync::watch::Sender::new(0);
        Faulty::wrap(inner, Self { answered })
    }

    async fn wait_for(&self, n: usize) {
        let mut answered = self.answered.subscribe();
        answered
            .wait_for(|&answered| answered >= n)
            .await
            .expect("the counter outlives the wait");
    }
}

#[async_trait::async_trait]
impl<S: OutboxStore> StoreFault<Arc<S>> for CountClaims {
    async fn claim_batch(
        &self,
        inner: &Arc<S>,
        request: &ClaimRequest,
    ) -> Result<ClaimedBatch, StoreError> {
        let batch = inner.claim_batch(request).await;
        self.answered.send_modify(|n| *n += 1);
        batch
    }
}

/// A broker outage pauses the relay; no attempt is burned; everything is
/// delivered in order once the broker is back. While it lasts the outage is
/// visible where operators look (the store's relay list, the relay's own
/// health handle), naming the destination and the broker's error; it clears
/// once publishing works again.
pub async fn outage_burns_no_attempts<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let events = events_over_keys(40, 4);
    enqueue_all(&*store, &events).await;
    let publisher = Arc::new(RecordingPublisher::new());
    publisher.set_outage(true);
    let relay = start(
        store.clone(),
        publisher.clone(),
        config("relay-outage"),
        None,
    );
    within("outage retries", publisher.wait_for_calls(5)).await;
    assert!(publisher.delivered().is_empty());
    // The first outage batch was recorded before the second call.
    let recorded = store
        .relays()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.relay == "relay-outage")
        .and_then(|r| r.outage)
        .expect("the store shows the relay in outage");
    assert_eq!(recorded.destination, publisher.destination());
    assert_eq!(recorded.reason, "broker unreachable (injected)");
    let seen = relay.health.outage().expect("the relay knows it is paused");
    assert_eq!(seen.outage.reason, recorded.reason);
    publisher.set_outage(false);
    within(
        "deliveries after the outage",
        publisher.wait_for_deliveries(40),
    )
    .await;
    // 40 events take at least three batches; the beat after the first
    // completed batch cleared the outage before the next was published.
    assert!(relay.health.outage().is_none());
    let cleared = store.relays().await.unwrap();
    assert!(
        cleared.iter().all(|r| r.outage.is_none()),
        "outage still recorded after recovery: {cleared:?}"
    );
    let report = relay.stop().await;
    assert!(report.outages >= 5, "{report:?}");
    assert_eq!((report.retried, report.failed), (0, 0));
    assert_eq!(by_key(&publisher.delivered()), expected_by_key(&events));
    for e in &events {
        assert!(
            store.history(e.event_id).await.unwrap().is_empty(),
            "an outage left history"
        );
    }
}

/// The relay dies after publishing, before acknowledging: the event is
/// published again, and a consumer using the inbox applies it once.
pub async fn crash_after_publish_before_ack_is_absorbed_by_the_inbox<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let publisher = Arc::new(RecordingPublisher::new());
    publisher.inject(e.event_id, Fault::DeliverThenHang);
    let doomed = start(
        store.clone(),
        publisher.clone(),
        config("relay-doomed"),
        None,
    );
    within("first delivery", publisher.wait_for_deliveries(1)).await;
    doomed.crash().await;
    assert!(matches!(
        state(&*store, e.event_id).await,
        EventState::InFlight { .. }
    ));

    publisher.clear(e.event_id);
    clock.advance(LEASE + Duration::from_secs(1));
    let survivor = start(
        store.clone(),
        publisher.clone(),
        config("relay-survivor"),
        None,
    );
    within("redelivery", publisher.wait_for_deliveries(2)).await;
    let report = survivor.stop().await;
    assert_eq!(report.published, 1);
    assert!(matches!(
        state(&*store, e.event_id).await,
        EventState::Published { .. }
    ));

    let consumer = MemoryInboxHarness::new(clock.clone());
    let mut applied = 0;
    for delivered in publisher.delivered() {
        assert_eq!(delivered.event_id, e.event_id);
        applied += usize::from(
            inbox_suite::deliver(&consumer, "billing", delivered.event_id)
                .await
                .unwrap(),
        );
    }
    assert_eq!(applied, 1, "two deliveries, one effect");
}

/// A relay whose lease expired mid-publish cannot acknowledge over the relay
/// that re-claimed the event.
pub async fn lease_expiry_mid_publish_fences_the_stale_ack<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let (mock, handle) = MockPublisher::pair();
    let slow = start(store.clone(), Arc::new(mock), config("relay-slow"), None);
    let stuck_call = within("the slow relay's publish", handle.next_call()).await;

    clock.advance(LEASE + Duration::from_secs(1));
    let recording = Arc::new(RecordingPublisher::new());
    let fast = start(store.clone(), recording.clone(), config("relay-fast"), None);
    within("re-claimed delivery", recording.wait_for_deliveries(1)).await;
    let fast_report = fast.stop().await;
    assert_eq!(fast_report.published, 1);

    stuck_call.succeed_all();
    let slow_report = slow.stop().await;
    assert_eq!(
        (slow_report.published, slow_report.fenced),
        (0, 1),
        "{slow_report:?}"
    );
    assert!(matches!(
        state(&*store, e.event_id).await,
        EventState::Published { .. }
    ));
}
