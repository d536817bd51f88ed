//! Hooks for the core's commit-order and failure suites (feature
//! `testing`): a write transaction left open, another host's clock, a row
//! another tool wrote, a settlement slow to commit.

use std::sync::Arc;

use async_trait::async_trait;
use diesel_async::pooled_connection::deadpool::Object;
use diesel_async::{AnsiTransactionManager, AsyncMysqlConnection, TransactionManager};
use futures::future::BoxFuture;
use outbox_core::store::{EnqueueOutcome, Lease, SettleReport};
use outbox_core::testing::{BeginWrite, FaultSeams, OpenWrite};
use outbox_core::{Clock, EventId, NewEvent, StoreError};
use outbox_sql::mysql::{Driver, Exec};

use super::driver::{Diesel, DieselDriver};
use super::store::MysqlStore;
use crate::error::ResultExt;

/// A pooled connection with a transaction open at the server's default
/// isolation (REPEATABLE READ), as business code opens one.
struct MysqlOpenWrite {
    store: MysqlStore,
    conn: Object<AsyncMysqlConnection>,
}

impl MysqlStore {
    /// A table standing for the business rows a transaction writes first.
    fn business_table(&self) -> String {
        self.config().tables.table("test_business")
    }
}

#[async_trait]
impl OpenWrite for MysqlOpenWrite {
    async fn write_business_row(&mut self) -> Result<(), StoreError> {
        let insert = format!(
            "INSERT INTO {} (note) VALUES ('paid')",
            self.store.business_table()
        );
        Diesel(&mut *self.conn).execute(&insert, Vec::new()).await?;
        Ok(())
    }
    async fn read(&mut self) -> Result<(), StoreError> {
        let count = format!(
            "SELECT COUNT(*) AS n FROM {}",
            self.store.config().tables.events()
        );
        Diesel(&mut *self.conn).fetch(&count, Vec::new()).await?;
        Ok(())
    }
    async fn enqueue(&mut self, event: NewEvent) -> Result<EnqueueOutcome, StoreError> {
        Ok(self
            .store
            .outbox()
            .enqueue(&mut self.conn, &[event])
            .await?[0])
    }
    async fn commit(mut self: Box<Self>) -> Result<(), StoreError> {
        AnsiTransactionManager::commit_transaction(&mut *self.conn)
            .await
            .store()
    }
}

#[async_trait]
impl BeginWrite for MysqlStore {
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError> {
        // DDL commits implicitly in MySQL: create the table first.
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {} (id BIGINT AUTO_INCREMENT PRIMARY KEY, note TEXT) \
             ENGINE = InnoDB",
            self.business_table()
        );
        Diesel(self.conn().await?)
            .execute(&create, Vec::new())
            .await?;
        let mut conn = self.conn().await?;
        AnsiTransactionManager::begin_transaction(&mut *conn)
            .await
            .store()?;
        Ok(Box::new(MysqlOpenWrite {
            store: self.clone(),
            conn,
        }))
    }
}

#[async_trait]
impl FaultSeams for MysqlStore {
    fn with_host_clock(&self, host_clock: Arc<dyn Clock>) -> Arc<Self> {
        let mut handle = self.clone();
        handle.protocol.config = handle.protocol.config.clone().with_clock(host_clock);
        Arc::new(handle)
    }

    async fn write_unreadable_row(&self, partition_key: &str) -> EventId {
        // Valid SQL, and no event: a header that is not a string.
        let id = EventId::random();
        let mut conn = Diesel(self.conn().await.expect("a connection"));
        let now = self.protocol.now(&mut conn).await.expect("store time");
        let insert = format!(
            "INSERT INTO {} (event_id, aggregate_type, aggregate_id, event_type, partition_key,
                 payload, payload_version, headers, created_at, available_at)
             VALUES (?, 'bad', ?, 'bad.row', ?, '{{}}', 1, '{{\"traceparent\": 5}}', ?, ?)",
            self.config().tables.events()
        );
        conn.execute(
            &insert,
            vec![
                id.to_string().into(),
                partition_key.into(),
                partition_key.into(),
                now.into(),
                now.into(),
            ],
        )
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
        DieselDriver::commit(tx).await?;
        Ok(report)
    }
}
