//! Hooks for the core's commit-order and failure suites (feature
//! `testing`): a write transaction left open, another host's clock, a row
//! another tool wrote, a settlement slow to commit.

use std::sync::Arc;

use async_trait::async_trait;
use diesel::sql_types::{Text, Uuid as SqlUuid};
use diesel_async::pooled_connection::deadpool::Object;
use diesel_async::{AnsiTransactionManager, AsyncPgConnection, RunQueryDsl, TransactionManager};
use futures::future::BoxFuture;
use outbox_core::store::{EnqueueOutcome, Lease, SettleReport};
use outbox_core::testing::{BeginWrite, FaultSeams, OpenWrite};
use outbox_core::{Clock, EventId, NewEvent, StoreError};

use super::PgOutbox;
use super::store::PgStore;
use crate::error::ResultExt;

/// A pooled connection with a transaction open, Diesel's manager aware.
struct PgOpenWrite {
    store: PgStore,
    conn: Object<AsyncPgConnection>,
}

#[async_trait]
impl OpenWrite for PgOpenWrite {
    async fn write_business_row(&mut self) -> Result<(), StoreError> {
        // What a business UPDATE does to the transaction: it gets its id.
        diesel::sql_query("SELECT pg_current_xact_id()")
            .execute(&mut *self.conn)
            .await
            .store()?;
        Ok(())
    }
    async fn read(&mut self) -> Result<(), StoreError> {
        diesel::sql_query(format!(
            "SELECT count(*) FROM {}",
            self.store.config().tables.events()
        ))
        .execute(&mut *self.conn)
        .await
        .store()?;
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
impl BeginWrite for PgStore {
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError> {
        let mut conn = self.conn().await?;
        AnsiTransactionManager::begin_transaction(&mut *conn)
            .await
            .store()?;
        Ok(Box::new(PgOpenWrite {
            store: self.clone(),
            conn,
        }))
    }
}

#[async_trait]
impl FaultSeams for PgStore {
    fn with_host_clock(&self, host_clock: Arc<dyn Clock>) -> Arc<Self> {
        let config = self.config().clone().with_clock(host_clock);
        let mut handle = self.clone();
        handle.protocol.statements.config = config.clone();
        handle.outbox = PgOutbox::new(config);
        Arc::new(handle)
    }

    async fn write_unreadable_row(&self, partition_key: &str) -> EventId {
        // Valid SQL, passes the table's checks, and is no event: a header
        // that is not a string.
        let id = EventId::random();
        let mut conn = self.conn().await.expect("a connection");
        diesel::sql_query(format!(
            "INSERT INTO {} (event_id, aggregate_type, aggregate_id, event_type, partition_key,
                 payload, headers)
             VALUES ($1, 'bad', $2, 'bad.row', $2, '{{}}', '{{\"traceparent\": 5}}')",
            self.config().tables.events()
        ))
        .bind::<SqlUuid, _>(*id.as_uuid())
        .bind::<Text, _>(partition_key)
        .execute(&mut conn)
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
        let mut conn = self.conn().await?;
        AnsiTransactionManager::begin_transaction(&mut *conn)
            .await
            .store()?;
        let report = self
            .protocol
            .ack_in(&mut super::driver::Diesel(&mut *conn), leases)
            .await?;
        let _ = ready.send(());
        release.await;
        AnsiTransactionManager::commit_transaction(&mut *conn)
            .await
            .store()?;
        Ok(report)
    }
}
