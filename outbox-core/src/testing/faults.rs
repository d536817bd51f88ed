//! Faults and checks shared by adapters' end-to-end tests. Each fault is a
//! small type in front of a store, an inbox or a publisher through the one
//! delegating [`Faulty`] wrapper; the names tests use ([`DieAfterCommit`],
//! [`FlakyInbox`], …) are that wrapper with a fault.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use tokio::sync::Notify;

use super::faulty::{Faulty, InboxFault, PublishFault};
use crate::error::StoreError;
use crate::event::{EventId, NewEvent, StoredEvent};
use crate::inbox::InboxStore;
use crate::publisher::{ErrorClass, PublishOutcome, Publisher};

/// An inbox whose `die_at`-th commit succeeds and then never returns: a
/// consumer that dies after its effect committed and before it acknowledged
/// the broker (`XACK`, offset commit).
pub type DieAfterCommit<I> = Faulty<I, HangAfterCommit>;

/// The fault of [`DieAfterCommit`].
pub struct HangAfterCommit {
    commits: AtomicUsize,
    die_at: usize,
    died: Arc<Notify>,
}

impl<I> DieAfterCommit<I> {
    /// Wraps `inner`; `died` is notified when the consumer "dies".
    pub fn new(inner: I, die_at: usize, died: Arc<Notify>) -> Self {
        let fault = HangAfterCommit {
            commits: AtomicUsize::new(0),
            die_at,
            died,
        };
        Faulty::wrap(inner, fault)
    }
}

#[async_trait]
impl<I: InboxStore> InboxFault<I> for HangAfterCommit {
    async fn commit(&self, inner: &I, tx: I::Transaction) -> Result<(), StoreError> {
        inner.commit(tx).await?;
        if self.commits.fetch_add(1, Ordering::SeqCst) + 1 == self.die_at {
            self.died.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// An inbox whose store "goes away" on a schedule: every `every`-th
/// operation (begin, claim or commit) fails with a retryable
/// [`StoreError::Unavailable`], as a database restart or a pool timeout
/// would. Every second failing commit fails *after* the inner commit
/// succeeded (the connection dropped while the COMMIT's reply was in
/// flight), so a runner must find out from the inbox that it was applied.
pub type FlakyInbox<I> = Faulty<I, FailEvery>;

/// The fault of [`FlakyInbox`].
pub struct FailEvery {
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
        let fault = FailEvery {
            operations: AtomicUsize::new(0),
            failed_commits: AtomicUsize::new(0),
            every,
            injected: Arc::default(),
        };
        Faulty::wrap(inner, fault)
    }
}

impl FailEvery {
    /// Fails this operation (`what`) if it is an `every`-th one.
    fn check(&self, what: &str) -> Result<(), StoreError> {
        let failing = (self.operations.fetch_add(1, Ordering::SeqCst) + 1) % self.every == 0;
        if !failing {
            return Ok(());
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        Err(StoreError::Unavailable(
            format!("injected: {what} lost the connection").into(),
        ))
    }
}

#[async_trait]
impl<I: InboxStore> InboxFault<I> for FailEvery {
    fn before(&self, operation: &str) -> Result<(), StoreError> {
        self.check(operation)
    }

    async fn commit(&self, inner: &I, tx: I::Transaction) -> Result<(), StoreError> {
        let Err(lost) = self.check("commit") else {
            return inner.commit(tx).await;
        };
        if self.failed_commits.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
            inner.rollback(tx).await?;
        } else {
            inner.commit(tx).await?;
        }
        Err(lost)
    }
}

/// Passes a publisher's outcomes through and counts the calls in which an
/// outcome was an outage: lets a test wait until a relay has met an outage
/// (a missing topic, a wrong-typed stream key) before it fixes the cause.
pub type OutageCounter<P> = Faulty<P, CountOutages>;

/// The fault (a counter) of [`OutageCounter`].
pub struct CountOutages {
    outages: tokio::sync::watch::Sender<usize>,
}

impl<P> OutageCounter<P> {
    /// Wraps `inner`.
    pub fn new(inner: P) -> Self {
        let outages = tokio::sync::watch::Sender::new(0);
        Faulty::wrap(inner, CountOutages { outages })
    }
}

impl CountOutages {
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
impl<P: Publisher> PublishFault<P> for CountOutages {
    async fn publish(&self, inner: &P, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let outcomes = inner.publish(batch).await;
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
pub type DieAfterPublishing<P> = Faulty<P, HangAfterPublishing>;

/// The fault of [`DieAfterPublishing`].
pub struct HangAfterPublishing {
    victim: EventId,
    died: Arc<Notify>,
}

impl<P> DieAfterPublishing<P> {
    /// Wraps `inner`; hangs after publishing `victim`.
    pub fn new(inner: P, victim: EventId, died: Arc<Notify>) -> Self {
        Faulty::wrap(inner, HangAfterPublishing { victim, died })
    }
}

#[async_trait]
impl<P: Publisher> PublishFault<P> for HangAfterPublishing {
    async fn publish(&self, inner: &P, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let outcomes = inner.publish(batch).await;
        if batch.iter().any(|e| e.event_id == self.victim) {
            self.died.notify_one();
            std::future::pending::<()>().await;
        }
        outcomes
    }
}

/// Holds publishes back while a test changes the world under a relay
/// (creates the missing topic, restarts the broker): [`Gate::close`]
/// waits for the publishes in flight and blocks new ones until its guard
/// is dropped, so no publish straddles the change.
pub type PublishGate<P> = Faulty<P, Gate>;

/// The fault (a gate) of [`PublishGate`].
pub struct Gate {
    lock: tokio::sync::RwLock<()>,
}

impl<P> PublishGate<P> {
    /// Wraps `inner`, open.
    pub fn new(inner: P) -> Self {
        let lock = tokio::sync::RwLock::new(());
        Faulty::wrap(inner, Gate { lock })
    }
}

impl Gate {
    /// Closes the gate until the guard is dropped.
    pub async fn close(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.lock.write().await
    }
}

#[async_trait]
impl<P: Publisher> PublishFault<P> for Gate {
    async fn publish(&self, inner: &P, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let _open = self.lock.read().await;
        inner.publish(batch).await
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
