//! Faults and checks shared by adapters' end-to-end tests.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::error::StoreError;
use crate::event::{EventId, NewEvent, StoredEvent};
use crate::inbox::InboxStore;
use crate::publisher::{ErrorClass, PublishOutcome, Publisher, PublisherCapabilities};

/// An inbox whose `die_at`-th commit succeeds and then never returns: a
/// consumer that dies after its effect committed and before it acknowledged
/// the broker (`XACK`, offset commit).
pub struct DieAfterCommit<I> {
    inner: I,
    commits: AtomicUsize,
    die_at: usize,
    died: Arc<Notify>,
}

impl<I> DieAfterCommit<I> {
    /// Wraps `inner`; `died` is notified when the consumer "dies".
    pub fn new(inner: I, die_at: usize, died: Arc<Notify>) -> Self {
        Self {
            inner,
            commits: AtomicUsize::new(0),
            die_at,
            died,
        }
    }
}

#[async_trait]
impl<I: InboxStore> InboxStore for DieAfterCommit<I> {
    type Transaction = I::Transaction;

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        self.inner.begin().await
    }

    async fn claim(
        &self,
        tx: &mut Self::Transaction,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        self.inner.claim(tx, consumer, event_id).await
    }

    async fn commit(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        self.inner.commit(tx).await?;
        if self.commits.fetch_add(1, Ordering::SeqCst) + 1 == self.die_at {
            self.died.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    async fn rollback(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        self.inner.rollback(tx).await
    }

    async fn purge_older_than(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        self.inner.purge_older_than(older_than, batch_size).await
    }
}

/// An inbox whose store "goes away" on a schedule: every `every`-th
/// operation (begin, claim or commit) fails with a retryable
/// [`StoreError::Unavailable`], as a database restart or a pool timeout
/// would. Every second failing commit fails *after* the inner commit
/// succeeded (the connection dropped while the COMMIT's reply was in
/// flight), so a runner must find out from the inbox that it was applied.
pub struct FlakyInbox<I> {
    inner: I,
    operations: AtomicUsize,
    failed_commits: AtomicUsize,
    every: usize,
    /// Failures injected so far.
    pub injected: Arc<AtomicUsize>,
}

impl<I> FlakyInbox<I> {
    /// Wraps `inner`; `every` must be at least 2 or nothing would succeed.
    pub fn new(inner: I, every: usize) -> Self {
        assert!(
            every >= 2,
            "a FlakyInbox that fails every operation never commits"
        );
        Self {
            inner,
            operations: AtomicUsize::new(0),
            failed_commits: AtomicUsize::new(0),
            every,
            injected: Arc::default(),
        }
    }

    fn fails_now(&self) -> bool {
        let failing = (self.operations.fetch_add(1, Ordering::SeqCst) + 1) % self.every == 0;
        if failing {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        failing
    }

    fn unavailable(what: &str) -> StoreError {
        StoreError::Unavailable(format!("injected: {what} lost the connection").into())
    }
}

#[async_trait]
impl<I: InboxStore> InboxStore for FlakyInbox<I> {
    type Transaction = I::Transaction;

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        if self.fails_now() {
            return Err(Self::unavailable("begin"));
        }
        self.inner.begin().await
    }

    async fn claim(
        &self,
        tx: &mut Self::Transaction,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        if self.fails_now() {
            return Err(Self::unavailable("claim"));
        }
        self.inner.claim(tx, consumer, event_id).await
    }

    async fn commit(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        if !self.fails_now() {
            return self.inner.commit(tx).await;
        }
        if self.failed_commits.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
            self.inner.rollback(tx).await?;
        } else {
            self.inner.commit(tx).await?;
        }
        Err(Self::unavailable("commit"))
    }

    async fn rollback(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        self.inner.rollback(tx).await
    }

    async fn purge_older_than(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        self.inner.purge_older_than(older_than, batch_size).await
    }
}

/// Passes a publisher's outcomes through and counts the calls in which an
/// outcome was an outage: lets a test wait until a relay has met an outage
/// (a missing topic, a wrong-typed stream key) before it fixes the cause.
pub struct OutageCounter<P> {
    inner: P,
    outages: tokio::sync::watch::Sender<usize>,
}

impl<P> OutageCounter<P> {
    /// Wraps `inner`.
    pub fn new(inner: P) -> Self {
        Self {
            inner,
            outages: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Calls that met an outage so far.
    pub fn outages(&self) -> usize {
        *self.outages.borrow()
    }

    /// Waits until at least `n` calls met an outage (woken by the call
    /// that meets it, not by polling).
    pub async fn wait_for_outages(&self, n: usize) {
        self.outages
            .subscribe()
            .wait_for(|&outages| outages >= n)
            .await
            .expect("the counter outlives the wait");
    }
}

#[async_trait]
impl<P: Publisher> Publisher for OutageCounter<P> {
    fn capabilities(&self) -> PublisherCapabilities {
        self.inner.capabilities()
    }

    fn destination(&self) -> String {
        self.inner.destination()
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let outcomes = self.inner.publish(batch).await;
        if outcomes
            .iter()
            .any(|o| matches!(o, Err(e) if e.class == ErrorClass::Outage))
        {
            self.outages.send_modify(|outages| *outages += 1);
        }
        outcomes
    }
}

/// Publishes through `inner`, then never returns from the call that holds
/// `victim`: a relay that dies after publishing and before acknowledging.
/// `died` is notified when that call has published; the test then aborts
/// the relay's task.
pub struct DieAfterPublishing<P> {
    inner: P,
    victim: EventId,
    died: Arc<Notify>,
}

impl<P> DieAfterPublishing<P> {
    /// Wraps `inner`; hangs after publishing `victim`.
    pub fn new(inner: P, victim: EventId, died: Arc<Notify>) -> Self {
        Self {
            inner,
            victim,
            died,
        }
    }
}

#[async_trait]
impl<P: Publisher> Publisher for DieAfterPublishing<P> {
    fn capabilities(&self) -> PublisherCapabilities {
        self.inner.capabilities()
    }

    fn destination(&self) -> String {
        self.inner.destination()
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let outcomes = self.inner.publish(batch).await;
        if batch.iter().any(|e| e.event_id == self.victim) {
            self.died.notify_one();
            std::future::pending::<()>().await;
        }
        outcomes
    }
}

/// Holds publishes back while a test changes the world under a relay
/// (creates the missing topic, restarts the broker): [`PublishGate::close`]
/// waits for the publishes in flight and blocks new ones until its guard
/// is dropped, so no publish straddles the change.
pub struct PublishGate<P> {
    /// The wrapped publisher.
    pub inner: P,
    lock: tokio::sync::RwLock<()>,
}

impl<P> PublishGate<P> {
    /// Wraps `inner`, open.
    pub fn new(inner: P) -> Self {
        Self {
            inner,
            lock: tokio::sync::RwLock::new(()),
        }
    }

    /// Closes the gate until the guard is dropped.
    pub async fn close(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.lock.write().await
    }
}

#[async_trait]
impl<P: Publisher> Publisher for PublishGate<P> {
    fn capabilities(&self) -> PublisherCapabilities {
        self.inner.capabilities()
    }

    fn destination(&self) -> String {
        self.inner.destination()
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let _open = self.lock.read().await;
        self.inner.publish(batch).await
    }
}

/// Checks a consumer's committed effects, `(partition key, event id)` in
/// commit order, against the events enqueued: every event applied exactly
/// once, and each key's events in enqueue order.
pub fn assert_exactly_once_in_key_order(effects: &[(String, EventId)], events: &[NewEvent]) {
    let applied: Vec<EventId> = effects.iter().map(|(_, id)| *id).collect();
    let unique: HashSet<_> = applied.iter().collect();
    assert_eq!(unique.len(), applied.len(), "an event was applied twice");
    assert_eq!(applied.len(), events.len(), "an event was never applied");
    let keys: BTreeSet<&str> = events.iter().map(|e| e.partition_key.as_str()).collect();
    for key in keys {
        let sent: Vec<EventId> = events
            .iter()
            .filter(|e| e.partition_key == key)
            .map(|e| e.event_id)
            .collect();
        let got: Vec<EventId> = effects
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, id)| *id)
            .collect();
        assert_eq!(got, sent, "order of key {key} at the consumer");
    }
}
