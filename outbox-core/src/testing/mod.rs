//! Conformance suites for backends (feature `testing`).
//!
//! Plain `pub async fn`s that any store, inbox, publisher or relay setup
//! calls against its live backend; the in-memory backends run them in the
//! core's own `cargo test`. Each takes a *factory* that builds a fresh,
//! isolated backend per call (its own database, schema or table prefix).
//! The `*_conformance_tests!` macros turn a whole suite into named
//! `#[tokio::test]`s.
//!
//! Stores take their time from the [`ManualClock`] the suite passes to the
//! factory, so lease expiry and backoff are driven by the test, not by sleeps.

mod cancel;
mod downstream;
pub mod failure_suite;
pub mod faults;
mod faulty;
mod fixtures;
mod fleet;
pub mod inbox_suite;
mod macros;
mod proxy;
pub mod publisher_suite;
pub mod relay_suite;
pub mod store_suite;
#[cfg(feature = "otel-testing")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "otel-testing")))]
pub mod trace_recorder;

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

pub use cancel::{Cuts, cancel_after_pending, cancel_at_every_await, cut_store_operations};
pub use downstream::Downstream;
pub use faults::{
    CountOutages, DieAfterCommit, DieAfterPublishing, FailEvery, FlakyInbox, Gate, HangAfterCommit,
    HangAfterPublishing, OutageCounter, PublishGate, assert_exactly_once_in_key_order,
};
pub use faulty::{Faulty, InboxFault, PublishFault, StoreFault};
pub use fixtures::{event, event_with_payload, events_over_keys, namespace, stored};
pub use fleet::RelayFleet;
pub use proxy::CuttableProxy;

use crate::clock::{Clock, ManualClock};
use crate::error::StoreError;
use crate::event::{EventId, NewEvent, StoredEvent};
use crate::inbox::InboxStore;
use crate::memory::{MemoryInbox, MemoryInboxTx, MemoryStore, MemoryWriteTx, RecordingPublisher};
use crate::publisher::Publisher;
use crate::store::{EnqueueOutcome, Lease, OutboxAdmin, OutboxStore, OutboxWriter, SettleReport};

/// Everything a store suite needs from a backend.
pub trait ConformingStore: OutboxStore + OutboxWriter + OutboxAdmin + 'static {}
impl<T: OutboxStore + OutboxWriter + OutboxAdmin + 'static> ConformingStore for T {}

/// Builds a fresh, isolated store on the given clock.
pub trait StoreFactory: Send + Sync {
    /// The store type.
    type Store: ConformingStore;
    /// A new empty store whose notion of "now" is `clock`.
    fn create(&self, clock: ManualClock) -> impl Future<Output = Arc<Self::Store>> + Send;
}

impl<F, Fut, S> StoreFactory for F
where
    F: Fn(ManualClock) -> Fut + Send + Sync,
    Fut: Future<Output = Arc<S>> + Send,
    S: ConformingStore,
{
    type Store = S;
    fn create(&self, clock: ManualClock) -> impl Future<Output = Arc<S>> + Send {
        self(clock)
    }
}

/// A write transaction left open on purpose, to test commit order, late
/// committers and strangers' transactions.
#[async_trait]
pub trait OpenWrite: Send {
    /// A business write that is not an event (`UPDATE invoices ...`): on a
    /// database it gives the transaction its id before any event is written.
    async fn write_business_row(&mut self) -> Result<(), StoreError>;
    /// Reads the outbox tables in the open transaction (under REPEATABLE
    /// READ this fixes its snapshot, as business code that read first does).
    async fn read(&mut self) -> Result<(), StoreError>;
    /// Inserts `event` in the open transaction, saying whether it was new.
    async fn enqueue(&mut self, event: NewEvent) -> Result<EnqueueOutcome, StoreError>;
    /// Commits the transaction.
    async fn commit(self: Box<Self>) -> Result<(), StoreError>;
}

/// A store that can leave a write transaction open for a test.
#[async_trait]
pub trait BeginWrite: Send + Sync {
    /// Opens a write transaction.
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError>;
}

#[async_trait]
impl OpenWrite for MemoryWriteTx {
    async fn write_business_row(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn read(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn enqueue(&mut self, event: NewEvent) -> Result<EnqueueOutcome, StoreError> {
        // As a unique key would: wait while another open transaction holds
        // the id, then report what the insert found.
        let mut writes = self.store.writes();
        while self.staged_elsewhere(event.event_id) {
            if writes.changed().await.is_err() {
                break;
            }
        }
        if self.committed(event.event_id) {
            return Ok(EnqueueOutcome::AlreadyExists);
        }
        MemoryWriteTx::enqueue(self, event)?;
        Ok(EnqueueOutcome::Inserted { sequence: 0 })
    }
    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        MemoryWriteTx::commit(*self);
        Ok(())
    }
}

#[async_trait]
impl FaultSeams for MemoryStore {
    fn with_host_clock(&self, host_clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(MemoryStore::with_host_clock(self, host_clock))
    }
    async fn write_unreadable_row(&self, partition_key: &str) -> EventId {
        MemoryStore::write_unreadable_row(self, partition_key, "headers: not a JSON object")
    }
    async fn slow_ack(
        &self,
        leases: &[Lease],
        ready: tokio::sync::oneshot::Sender<()>,
        release: futures::future::BoxFuture<'static, ()>,
    ) -> Result<SettleReport, StoreError> {
        // The memory store holds nothing while a settlement waits.
        let _ = ready.send(());
        release.await;
        self.ack(leases).await
    }
}

#[async_trait]
impl BeginWrite for MemoryStore {
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError> {
        Ok(Box::new(MemoryStore::begin_write(self)))
    }
}

/// Fault seams the failure suite needs from a store:
/// each one is something users meet in production, made to happen on cue.
#[async_trait]
pub trait FaultSeams: ConformingStore + BeginWrite {
    /// Another handle on the same tables whose host clock is `host_clock`
    /// (a relay or producer on a host whose clock is off); store time stays
    /// the store's.
    fn with_host_clock(&self, host_clock: Arc<dyn Clock>) -> Arc<Self>;
    /// Writes, as another tool could, a committed row of key
    /// `partition_key` that this store cannot decode into an event (for
    /// example headers with a non-string value); returns its id.
    async fn write_unreadable_row(&self, partition_key: &str) -> EventId;
    /// Acks `leases` in a transaction kept open, after the ack's statements
    /// ran (then `ready` is sent), until `release` resolves: a settlement
    /// that is slow to commit.
    async fn slow_ack(
        &self,
        leases: &[Lease],
        ready: tokio::sync::oneshot::Sender<()>,
        release: futures::future::BoxFuture<'static, ()>,
    ) -> Result<SettleReport, StoreError>;
    /// Whether two write transactions can be open at once (SQLite: no, it
    /// has one writer at a time; tests that need two skip, saying so).
    fn overlapping_writers(&self) -> bool {
        true
    }
}

/// An inbox plus a way to write a test effect in the inbox's transaction, so
/// the suite can check that effect and claim commit (or roll back) together.
#[async_trait]
pub trait InboxHarness: Send + Sync + 'static {
    /// The inbox.
    type Inbox: InboxStore + 'static;
    /// The inbox under test.
    fn inbox(&self) -> &Self::Inbox;
    /// Writes an effect "`consumer` applied `event_id`" inside `tx`.
    async fn apply_effect(
        &self,
        tx: &mut <Self::Inbox as InboxStore>::Transaction,
        consumer: &str,
        event_id: EventId,
    ) -> Result<(), StoreError>;
    /// Committed effects of `consumer`, in commit order.
    async fn effects(&self, consumer: &str) -> Result<Vec<EventId>, StoreError>;
    /// Moves the inbox's clock (for retention tests).
    fn clock(&self) -> &ManualClock;
}

/// [`InboxHarness`] over [`MemoryInbox`], effects kept in a shared list.
#[derive(Debug, Clone)]
pub struct MemoryInboxHarness {
    inbox: MemoryInbox,
    effects: Arc<std::sync::Mutex<Vec<(String, EventId)>>>,
    clock: ManualClock,
}

impl MemoryInboxHarness {
    /// A fresh inbox on `clock`.
    pub fn new(clock: ManualClock) -> Self {
        Self {
            inbox: MemoryInbox::with_clock(Arc::new(clock.clone())),
            effects: Arc::default(),
            clock,
        }
    }
}

#[async_trait]
impl InboxHarness for MemoryInboxHarness {
    type Inbox = MemoryInbox;
    fn inbox(&self) -> &MemoryInbox {
        &self.inbox
    }
    async fn apply_effect(
        &self,
        tx: &mut MemoryInboxTx,
        consumer: &str,
        event_id: EventId,
    ) -> Result<(), StoreError> {
        let effects = self.effects.clone();
        let consumer = consumer.to_owned();
        tx.on_commit(move || effects.lock().expect("effects").push((consumer, event_id)));
        Ok(())
    }
    async fn effects(&self, consumer: &str) -> Result<Vec<EventId>, StoreError> {
        Ok(self
            .effects
            .lock()
            .expect("effects")
            .iter()
            .filter(|(c, _)| c == consumer)
            .map(|(_, id)| *id)
            .collect())
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

/// A publisher plus a way to read back what reached the broker.
#[async_trait]
pub trait PublisherHarness: Send + Sync {
    /// The publisher.
    type Publisher: Publisher + 'static;
    /// The publisher under test.
    fn publisher(&self) -> Arc<Self::Publisher>;
    /// Waits for (with the harness's own deadline) and returns the next `n`
    /// events that reached the broker, in broker order per key.
    async fn read_back(&self, n: usize) -> Vec<ReceivedEvent>;
    /// A publisher of the same kind whose broker cannot be reached (a
    /// closed port): every outcome it gives must be an outage.
    async fn unreachable_publisher(&self) -> Arc<Self::Publisher>;
}

/// `(name, value)` pairs as a broker carried them.
pub type NamedValues = Vec<(String, String)>;

/// An event as a consumer sees it on the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedEvent {
    /// From the `event_id` header/attribute/field.
    pub event_id: EventId,
    /// From the `event_type` header/attribute/field.
    pub event_type: String,
    /// The broker's key, or the `partition_key` field.
    pub partition_key: String,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// Headers as flattened pairs (see [`crate::Headers::iter`]), sorted.
    pub headers: Vec<(String, String)>,
    /// The envelope's identity and metadata **under the names the broker
    /// carried them** (headers, fields or attributes named as in
    /// [`crate::event::wire::IDENTITY`]), sorted: the same on every broker.
    pub envelope: Vec<(String, String)>,
}

impl ReceivedEvent {
    /// What a faithful broker round trip of `event` yields.
    pub fn expected(event: &StoredEvent) -> Self {
        let mut headers: Vec<(String, String)> = event
            .headers
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        headers.sort();
        let mut envelope: Vec<(String, String)> = crate::event::wire::identity(event)
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        envelope.sort();
        Self {
            event_id: event.event_id,
            event_type: event.event_type.clone(),
            partition_key: event.partition_key.clone(),
            payload: event.payload.as_bytes().to_vec(),
            headers,
            envelope,
        }
    }

    /// Splits `(name, value)` pairs as a broker carried them into the
    /// envelope's (names in [`crate::event::wire::IDENTITY`]) and the rest,
    /// both sorted.
    pub fn split_envelope(
        pairs: impl IntoIterator<Item = (String, String)>,
    ) -> (NamedValues, NamedValues) {
        let (mut envelope, mut rest): (Vec<_>, Vec<_>) = pairs
            .into_iter()
            .partition(|(name, _)| crate::event::wire::IDENTITY.contains(&name.as_str()));
        envelope.sort();
        rest.sort();
        (envelope, rest)
    }
}

/// [`PublisherHarness`] over [`RecordingPublisher`].
#[derive(Debug, Default, Clone)]
pub struct RecordingHarness {
    publisher: Arc<RecordingPublisher>,
    read: Arc<std::sync::Mutex<usize>>,
}

#[async_trait]
impl PublisherHarness for RecordingHarness {
    type Publisher = RecordingPublisher;
    fn publisher(&self) -> Arc<RecordingPublisher> {
        self.publisher.clone()
    }
    async fn unreachable_publisher(&self) -> Arc<RecordingPublisher> {
        let down = RecordingPublisher::new();
        down.set_outage(true);
        Arc::new(down)
    }
    async fn read_back(&self, n: usize) -> Vec<ReceivedEvent> {
        let start = *self.read.lock().expect("read cursor");
        self.publisher.wait_for_deliveries(start + n).await;
        *self.read.lock().expect("read cursor") = start + n;
        self.publisher.delivered()[start..start + n]
            .iter()
            .map(ReceivedEvent::expected)
            .collect()
    }
}

/// Enqueues and unwraps, for suites.
pub(crate) async fn enqueue_all<S: OutboxWriter + ?Sized>(store: &S, events: &[NewEvent]) {
    let outcomes = store.enqueue(events).await.expect("enqueue");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, EnqueueOutcome::Inserted { .. })),
        "fixture events must be new: {outcomes:?}"
    );
}

/// Asserts what a report printer would show for `error` (its text, then
/// each source) names `operation` on `table` and says the driver's message
/// exactly once.
pub fn assert_names_the_operation_once(error: &StoreError, operation: &str, table: &str) {
    let mut report = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        report.push_str(&format!(", caused by: {cause}"));
        source = cause.source();
    }
    assert!(
        report.contains(&format!("{operation} on {table}: ")),
        "the error does not name {operation} on {table}: {report}"
    );
    let driver = error
        .driver_error()
        .unwrap_or_else(|| panic!("not a driver error: {report}"))
        .to_string();
    assert_eq!(
        report.matches(driver.as_str()).count(),
        1,
        "the driver's message is not said exactly once: {report}"
    );
}
