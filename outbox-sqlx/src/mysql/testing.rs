//! Hooks for the core's conformance suites (feature `testing`).

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use outbox_core::store::{EnqueueOutcome, Lease, SettleReport};
use outbox_core::testing::{BeginWrite, FaultSeams, OpenWrite};
use outbox_core::{Clock, EventId, NewEvent, StoreError};
use sqlx::{MySql, Transaction};

use super::driver::Sqlx;
use super::store::MySqlStore;
use crate::error::ResultExt;

struct MySqlOpenWrite {
    store: MySqlStore,
    tx: Transaction<'static, MySql>,
}

impl MySqlStore {
    /// A table standing for the business rows a transaction writes first.
    fn business_table(&self) -> String {
        self.config().tables.table("test_business")
    }
}

#[async_trait]
impl OpenWrite for MySqlOpenWrite {
    async fn write_business_row(&mut self) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "INSERT INTO {} (note) VALUES ('paid')",
            self.store.business_table()
        ))
        .execute(&mut *self.tx)
        .await
        .store()?;
        Ok(())
    }
    async fn read(&mut self) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "SELECT COUNT(*) FROM {}",
            self.store.config().tables.events()
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
impl BeginWrite for MySqlStore {
    /// A transaction at the server's default isolation (REPEATABLE READ),
    /// as business code opens one.
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError> {
        // DDL commits implicitly in MySQL: create the table first.
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {} (id BIGINT AUTO_INCREMENT PRIMARY KEY, note TEXT) \
             ENGINE = InnoDB",
            self.business_table()
        ))
        .execute(self.pool())
        .await
        .store()?;
        let tx = self.pool().begin().await.store()?;
        Ok(Box::new(MySqlOpenWrite {
            store: self.clone(),
            tx,
        }))
    }
}

#[async_trait]
impl FaultSeams for MySqlStore {
    fn with_host_clock(&self, host_clock: Arc<dyn Clock>) -> Arc<Self> {
        let mut handle = self.clone();
        handle.protocol.config = handle.protocol.config.clone().with_clock(host_clock);
        Arc::new(handle)
    }

    async fn write_unreadable_row(&self, partition_key: &str) -> EventId {
        // Valid SQL, and no event: a header that is not a string.
        let id = EventId::random();
        let mut conn = self.pool().acquire().await.expect("a connection");
        let now = self
            .protocol
            .now(&mut Sqlx(&mut *conn))
            .await
            .expect("store time");
        sqlx::query(&format!(
            "INSERT INTO {} (event_id, aggregate_type, aggregate_id, event_type, partition_key,
                 payload, payload_version, headers, created_at, available_at)
             VALUES (?, 'bad', ?, 'bad.row', ?, '{{}}', 1, '{{\"traceparent\": 5}}', ?, ?)",
            self.config().tables.events()
        ))
        .bind(id.to_string())
        .bind(partition_key)
        .bind(partition_key)
        .bind(now)
        .bind(now)
        .execute(&mut *conn)
        .await
        .expect("insert an unreadable row");
        id
    }

    async fn slow_ack(
        &self,
        leases: &[Lease],
        ready: tokio::sync::oneshot::Sender<()>,
        release: BoxFuture<'static, ()>,
    ) -> Result<SettleReport, StoreError> {
        let mut tx = self.protocol.begin_relay().await?;
        let report = self.protocol.ack_in(&mut tx, leases).await?;
        let _ = ready.send(());
        release.await;
        <super::driver::SqlxDriver as outbox_sql::mysql::Driver>::commit(tx).await?;
        Ok(report)
    }
}
