//! Hooks for the core's conformance suites (feature `testing`).

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use outbox_core::store::{EnqueueOutcome, Lease, OutboxStore, SettleReport};
use outbox_core::testing::{BeginWrite, FaultSeams, OpenWrite};
use outbox_core::{Clock, EventId, NewEvent, StoreError};
use sqlx::{Sqlite, Transaction};

use super::store::SqliteStore;
use crate::error::ResultExt;

struct SqliteOpenWrite {
    store: SqliteStore,
    tx: Transaction<'static, Sqlite>,
}

#[async_trait]
impl OpenWrite for SqliteOpenWrite {
    async fn write_business_row(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn read(&mut self) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "SELECT COUNT(*) FROM {}",
            self.store.config.tables.events()
        ))
        .execute(&mut *self.tx)
        .await
        .store()?;
        Ok(())
    }
    async fn enqueue(&mut self, event: NewEvent) -> Result<EnqueueOutcome, StoreError> {
        Ok(self.store.enqueue(&mut self.tx, &[event]).await?[0])
    }
    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        self.tx.commit().await.store()
    }
}

#[async_trait]
impl BeginWrite for SqliteStore {
    /// `BEGIN IMMEDIATE`: SQLite has one writer at a time, so a second
    /// write transaction waits for the first to end.
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError> {
        let tx = self.begin_immediate().await?;
        Ok(Box::new(SqliteOpenWrite {
            store: self.clone(),
            tx,
        }))
    }
}

#[async_trait]
impl FaultSeams for SqliteStore {
    fn with_host_clock(&self, host_clock: Arc<dyn Clock>) -> Arc<Self> {
        let mut handle = self.clone();
        handle.config = handle.config.with_clock(host_clock);
        Arc::new(handle)
    }

    async fn write_unreadable_row(&self, partition_key: &str) -> EventId {
        // Valid SQL, and no event: a header that is not a string.
        let id = EventId::random();
        let mut tx = self.begin_immediate().await.expect("the write lock");
        let now = self.now(&mut tx).await.expect("store time");
        sqlx::query(&format!(
            "INSERT INTO {} (event_id, aggregate_type, aggregate_id, event_type, partition_key,
                 payload, payload_version, headers, created_at, available_at)
             VALUES (?1, 'bad', ?2, 'bad.row', ?2, '{{}}', 1, '{{\"traceparent\": 5}}', ?3, ?3)",
            self.config.tables.events()
        ))
        .bind(id.to_string())
        .bind(partition_key)
        .bind(now)
        .execute(&mut *tx)
        .await
        .expect("insert an unreadable row");
        tx.commit().await.expect("commit");
        id
    }

    async fn slow_ack(
        &self,
        leases: &[Lease],
        ready: tokio::sync::oneshot::Sender<()>,
        release: BoxFuture<'static, ()>,
    ) -> Result<SettleReport, StoreError> {
        // One writer at a time: a held settlement holds every writer, so
        // the suite does not run this test here (overlapping_writers).
        let _ = ready.send(());
        release.await;
        self.ack(leases).await
    }

    fn overlapping_writers(&self) -> bool {
        false
    }
}
