//! The consumer side: exactly-once effects over at-least-once delivery.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::StoreError;
use crate::event::EventId;

/// Records which events a consumer has applied, inside the consumer's own
/// transaction.
///
/// The transaction type is the adapter's (a `sqlx::Transaction`, a diesel
/// connection): the effect and the claim commit together, so a redelivered
/// event is applied once. A consumer runner does: receive → [`begin`] →
/// [`claim`] → handler(tx) → [`commit`] → ack the broker.
///
/// [`begin`]: InboxStore::begin
/// [`claim`]: InboxStore::claim
/// [`commit`]: InboxStore::commit
#[async_trait]
pub trait InboxStore: Send + Sync {
    /// The transaction the claim and the effect share.
    type Transaction: Send;

    /// Opens a transaction.
    async fn begin(&self) -> Result<Self::Transaction, StoreError>;

    /// Claims `(consumer, event_id)` inside `tx`: `true` the first time, so
    /// the caller applies its effect; `false` if it was already applied.
    async fn claim(
        &self,
        tx: &mut Self::Transaction,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError>;

    /// Commits the claim together with the effect.
    async fn commit(&self, tx: Self::Transaction) -> Result<(), StoreError>;

    /// Abandons the claim and the effect.
    async fn rollback(&self, tx: Self::Transaction) -> Result<(), StoreError>;

    /// Deletes at most `batch_size` claims older than `older_than`. The
    /// retention must outlive the longest redelivery or replay window, or a
    /// late duplicate is applied again.
    async fn purge_older_than(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError>;
}
