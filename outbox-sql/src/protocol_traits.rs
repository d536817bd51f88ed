//! The core's store traits on each dialect's `Protocol`, written once: an
//! adapter's store type takes them with [`crate::delegate_sql_store!`].
//! Each call is named in its errors ([`during`]), syncs store time for
//! tests, and skips empty settlements here; a dialect writes only the
//! work (`claim_batch_now`, `ack_now`, `nack_now`, `release_now`,
//! `heartbeat_now`, `inbox_gc`).

use async_trait::async_trait;
use outbox_core::store::{
    ClaimRequest, ClaimedBatch, EnqueueOutcome, Heartbeat, Lease, Nack, OutboxStore, OutboxWriter,
    Release, SettleReport,
};
use outbox_core::{NewEvent, StoreError};

use crate::error::during;

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
                during("enqueue", || self.events(), async move {
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
            /// A settlement named `operation` in errors: nothing when it
            /// settles nothing (`empty`), else store time synced first
            /// (if `sync`), then `work`.
            async fn settling<F, W>(
                &self,
                operation: &'static str,
                empty: bool,
                sync: bool,
                work: W,
            ) -> Result<SettleReport, StoreError>
            where
                W: FnOnce() -> F,
                F: std::future::Future<Output = Result<SettleReport, StoreError>>,
            {
                during(operation, || self.events(), async move {
                    if empty {
                        return Ok(SettleReport::default());
                    }
                    if sync {
                        self.sync_clock().await?;
                    }
                    work().await
                })
                .await
            }

            /// Deletes up to `batch_size` inbox claims older than
            /// `older_than` of store time; how many.
            pub async fn inbox_purge(
                &self,
                older_than: std::time::Duration,
                batch_size: usize,
            ) -> Result<u64, StoreError> {
                let tables = || self.config.tables.inbox();
                during("inbox purge_older_than", tables, async move {
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
                during("claim_batch", || self.events(), async move {
                    self.sync_clock().await?;
                    self.claim_batch_now(request).await
                })
                .await
            }
            async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
                let work = || self.ack_now(leases);
                self.settling("ack", leases.is_empty(), true, work).await
            }
            async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
                let work = || self.nack_now(nacks);
                self.settling("nack", nacks.is_empty(), true, work).await
            }
            async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
                // A release follows its claim, which synced store time.
                let work = || self.release_now(releases);
                self.settling("release", releases.is_empty(), false, work)
                    .await
            }
            async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
                during("heartbeat", || self.events(), async move {
                    self.sync_clock().await?;
                    self.heartbeat_now(beat).await
                })
                .await
            }
        }
    };
}

store_traits_on_protocol!(mysql);
store_traits_on_protocol!(postgres);
store_traits_on_protocol!(sqlite);
