//! SQLite's fault seams over any driver (feature `testing`).

use async_trait::async_trait;
use outbox_core::store::{Lease, SettleReport};
use outbox_core::testing::OpenWrite;
use outbox_core::{EventId, StoreError};

use super::{Driver, Exec, Protocol};
use crate::testing::{Release, SeamsProtocol, SlowAck};

dialect_write!();

#[async_trait]
impl<D: Driver> SeamsProtocol for Protocol<D> {
    /// `BEGIN IMMEDIATE`: SQLite has one writer at a time, so a second
    /// write transaction waits for the first to end (the transaction holds
    /// the write lock from its start: a business write changes nothing).
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError> {
        let tx = self.driver.begin().await?;
        Ok(open_write(self, tx, "SELECT 1 AS n"))
    }

    async fn write_unreadable_row(&self, partition_key: &str) -> EventId {
        // Valid SQL, and no event: a header that is not a string.
        let id = EventId::random();
        let mut tx = self.driver.begin().await.expect("the write lock");
        let now = self.now(&mut tx).await.expect("store time");
        let insert = format!(
            "INSERT INTO {} (event_id, aggregate_type, aggregate_id, event_type, partition_key,
                 payload, payload_version, headers, created_at, available_at)
             VALUES (?1, 'bad', ?2, 'bad.row', ?2, '{{}}', 1, '{{\"traceparent\": 5}}', ?3, ?3)",
            self.config.tables.events()
        );
        let params = vec![id.to_string().into(), partition_key.into(), now.into()];
        tx.execute(&insert, params)
            .await
            .expect("insert an unreadable row");
        D::commit(tx).await.expect("commit");
        id
    }

    fn overlapping_writers(&self) -> bool {
        false
    }
}

#[async_trait]
impl<D: Driver> SlowAck for Protocol<D> {
    async fn slow_ack(
        &self,
        leases: &[Lease],
        ready: tokio::sync::oneshot::Sender<()>,
        release: Release,
    ) -> Result<SettleReport, StoreError> {
        // One writer at a time: a held settlement holds every writer, so
        // the suite does not run this test here (overlapping_writers).
        let _ = ready.send(());
        release.await;
        outbox_core::OutboxStore::ack(self, leases).await
    }
}
