//! The core's store traits on [`Protocol`] (an adapter's store type takes
//! them with [`crate::delegate_sql_store!`]).

use async_trait::async_trait;
use outbox_core::store::{
    ClaimRequest, ClaimedBatch, EnqueueOutcome, Heartbeat, Lease, Nack, OutboxStore, OutboxWriter,
    Release, SettleReport,
};
use outbox_core::{NewEvent, StoreError};

use super::driver::Driver;
use super::protocol::Protocol;

#[async_trait]
impl<D: Driver> OutboxWriter for Protocol<D> {
    async fn enqueue(&self, events: &[NewEvent]) -> Result<Vec<EnqueueOutcome>, StoreError> {
        self.enqueue_alone(events).await
    }
}

#[async_trait]
impl<D: Driver> OutboxStore for Protocol<D> {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        Protocol::claim_batch(self, request).await
    }
    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        Protocol::ack(self, leases).await
    }
    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        Protocol::nack(self, nacks).await
    }
    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        Protocol::release(self, releases).await
    }
    async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        Protocol::heartbeat(self, beat).await
    }
}
