//! The core's store traits on each dialect's `Protocol`, written once: an
//! adapter's store type takes them with [`crate::delegate_sql_store!`].

use async_trait::async_trait;
use outbox_core::store::{
    ClaimRequest, ClaimedBatch, EnqueueOutcome, Heartbeat, Lease, Nack, OutboxStore, OutboxWriter,
    Release, SettleReport,
};
use outbox_core::{NewEvent, StoreError};

/// `OutboxWriter` and `OutboxStore` for `$dialect::Protocol<D>`, each call
/// handed to the protocol's method of the same name; an enqueue of its own
/// runs in a producer's transaction (`begin_producer`).
macro_rules! store_traits_on_protocol {
    ($dialect:ident) => {
        #[async_trait]
        impl<D: crate::$dialect::Driver> OutboxWriter for crate::$dialect::Protocol<D> {
            async fn enqueue(
                &self,
                events: &[NewEvent],
            ) -> Result<Vec<EnqueueOutcome>, StoreError> {
                crate::error::during("enqueue", || self.events(), async move {
                    self.sync_clock().await?;
                    let mut tx = self.begin_producer().await?;
                    let outcomes = self.statements.enqueue(&mut tx, events).await?;
                    D::commit(tx).await?;
                    Ok(outcomes)
                })
                .await
            }
        }

        impl<D: crate::$dialect::Driver> crate::$dialect::Protocol<D> {
            /// Deletes up to `batch_size` inbox claims older than
            /// `older_than` of store time; how many.
            pub async fn inbox_purge(
                &self,
                older_than: std::time::Duration,
                batch_size: usize,
            ) -> Result<u64, StoreError> {
                let tables = || self.config.tables.inbox();
                crate::error::during("inbox purge_older_than", tables, async move {
                    self.sync_clock().await?;
                    self.inbox_gc(older_than, batch_size).await
                })
                .await
            }
        }

        #[async_trait]
        impl<D: crate::$dialect::Driver> OutboxStore for crate::$dialect::Protocol<D> {
            async fn claim_batch(
                &self,
                request: &ClaimRequest,
            ) -> Result<ClaimedBatch, StoreError> {
                Self::claim_batch(self, request).await
            }
            async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
                Self::ack(self, leases).await
            }
            async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
                Self::nack(self, nacks).await
            }
            async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
                Self::release(self, releases).await
            }
            async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
                Self::heartbeat(self, beat).await
            }
        }
    };
}

store_traits_on_protocol!(mysql);
store_traits_on_protocol!(postgres);
store_traits_on_protocol!(sqlite);
