//! One delegating wrapper for every fault a test injects: [`Faulty`] puts
//! a fault in front of a store, an inbox or a publisher and passes every
//! call the fault does not take to the wrapped one. A fault is a small
//! type implementing [`StoreFault`], [`InboxFault`] or [`PublishFault`]
//! with only the calls it changes; the rest of each trait is written once,
//! here.

use std::ops::Deref;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::event::{EventId, StoredEvent};
use crate::inbox::InboxStore;
use crate::publisher::{PublishOutcome, Publisher, PublisherCapabilities};
use crate::store::{
    ClaimRequest, ClaimedBatch, Heartbeat, Lease, Nack, OutboxStore, Release, SettleReport,
};

/// `inner` with `fault` in front. Derefs to the fault, so a fault's own
/// counters and controls read as the wrapper's (`flaky.injected`,
/// `gate.close()`).
pub struct Faulty<T, F> {
    /// The wrapped store, inbox or publisher.
    pub inner: T,
    /// What goes wrong.
    pub fault: F,
}

impl<T, F> Faulty<T, F> {
    /// Puts `fault` in front of `inner`.
    pub fn wrap(inner: T, fault: F) -> Self {
        Self { inner, fault }
    }
}

impl<T, F> Deref for Faulty<T, F> {
    type Target = F;

    fn deref(&self) -> &F {
        &self.fault
    }
}

/// What goes wrong in a store's claims (settlement and heartbeats pass
/// through).
#[async_trait]
pub trait StoreFault<S: OutboxStore>: Send + Sync {
    /// A claim; by default `inner`'s.
    async fn claim_batch(
        &self,
        inner: &S,
        request: &ClaimRequest,
    ) -> Result<ClaimedBatch, StoreError> {
        inner.claim_batch(request).await
    }
}

#[async_trait]
impl<S: OutboxStore, F: StoreFault<S>> OutboxStore for Faulty<S, F> {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        self.fault.claim_batch(&self.inner, request).await
    }
    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        self.inner.ack(leases).await
    }
    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        self.inner.nack(nacks).await
    }
    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        self.inner.release(releases).await
    }
    async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        self.inner.heartbeat(beat).await
    }
}

/// What goes wrong in an inbox's transactions (rollback and purge pass
/// through).
#[async_trait]
pub trait InboxFault<I: InboxStore>: Send + Sync {
    /// Before `begin` or `claim` (`operation`) reach the inner inbox: an
    /// error fails the operation with it. By default nothing goes wrong.
    fn before(&self, operation: &str) -> Result<(), StoreError> {
        let _ = operation;
        Ok(())
    }
    /// A commit; by default `inner`'s.
    async fn commit(&self, inner: &I, tx: I::Transaction) -> Result<(), StoreError> {
        inner.commit(tx).await
    }
}

#[async_trait]
impl<I: InboxStore, F: InboxFault<I>> InboxStore for Faulty<I, F> {
    type Transaction = I::Transaction;

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        self.fault.before("begin")?;
        self.inner.begin().await
    }
    async fn claim(
        &self,
        tx: &mut Self::Transaction,
        consumer: &str,
        id: EventId,
    ) -> Result<bool, StoreError> {
        self.fault.before("claim")?;
        self.inner.claim(tx, consumer, id).await
    }
    async fn commit(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        self.fault.commit(&self.inner, tx).await
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

/// What goes wrong in a publisher's calls (its destination passes
/// through).
#[async_trait]
pub trait PublishFault<P: Publisher>: Send + Sync {
    /// A call's outcomes.
    async fn publish(&self, inner: &P, batch: &[&StoredEvent]) -> Vec<PublishOutcome>;
    /// What the publisher says it can do; by default `inner`'s.
    fn capabilities(&self, inner: &P) -> PublisherCapabilities {
        inner.capabilities()
    }
}

#[async_trait]
impl<P: Publisher, F: PublishFault<P>> Publisher for Faulty<P, F> {
    fn capabilities(&self) -> PublisherCapabilities {
        self.fault.capabilities(&self.inner)
    }
    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        self.fault.publish(&self.inner, batch).await
    }
    fn destination(&self) -> String {
        self.inner.destination()
    }
}
