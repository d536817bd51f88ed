//! Hooks for the core's conformance suites (feature `testing`).

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use outbox_core::store::{EnqueueOutcome, Lease, SettleReport};
use outbox_core::testing::{BeginWrite, FaultSeams, OpenWrite};
use outbox_core::{Clock, EventId, NewEvent, StoreError};
use sqlx::{Postgres, Transaction};

use super::store::PgStore;
use crate::error::ResultExt;

struct PgOpenWrite {
    store: PgStore,
    tx: Transaction<'static, Postgres>,
}

#[async_trait]
impl OpenWrite for PgOpenWrite {
    async fn write_business_row(&mut self) -> Result<(), StoreError> {
        // What a business UPDATE does to the transaction: it gets its id.
        sqlx::query("SELECT pg_current_xact_id()")
            .execute(&mut *self.tx)
            .await
            .store()?;
        Ok(())
    }
    async fn read(&mut self) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "SELECT count(*) FROM {}",
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
impl BeginWrite for PgStore {
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError> {
        let tx = self.pool.begin().await.store()?;
        Ok(Box::new(PgOpenWrite {
            store: self.clone(),
            tx,
        }))
    }
}

#[async_trait]
impl FaultSeams for PgStore {
    fn with_host_clock(&self, host_clock: Arc<dyn Clock>) -> Arc<Self> {
        let mut handle = self.clone();
        handle.config = handle.config.with_clock(host_clock);
        Arc::new(handle)
    }

    async fn write_unreadable_row(&self, partition_key: &str) -> EventId {
        // Valid SQL, passes the table's checks, and is no event: a header
        // that is not a string.
        let id = EventId::random();
        sqlx::query(&format!(
            "INSERT INTO {} (event_id, aggregate_type, aggregate_id, event_type, partition_key,
                 payload, headers)
             VALUES ($1, 'bad', $2, 'bad.row', $2, '{{}}', '{{\"traceparent\": 5}}')",
            self.config.tables.events()
        ))
        .bind(id.as_uuid())
        .bind(partition_key)
        .execute(&self.pool)
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
        let mut tx = self.pool.begin().await.store()?;
        let report = self.ack_in(&mut tx, leases).await?;
        let _ = ready.send(());
        release.await;
        tx.commit().await.store()?;
        Ok(report)
    }
}

/// An effects table for end-to-end tests: a consumer's handler records
/// `(partition key, event id)` inside its inbox transaction, and the test
/// reads them back in commit order to check exactly-once and key order.
#[derive(Clone, Debug)]
pub struct EffectLog {
    pool: sqlx::PgPool,
    table: String,
}

impl EffectLog {
    /// Creates `{schema}.effects` (the schema must exist).
    pub async fn create(pool: &sqlx::PgPool, schema: &str) -> Result<Self, StoreError> {
        crate::config::check_identifier("schema", schema, 63)?;
        let table = format!("{schema}.effects");
        sqlx::query(&format!(
            "CREATE TABLE {table} (seq BIGSERIAL PRIMARY KEY, partition_key TEXT NOT NULL, event_id UUID NOT NULL)"
        ))
        .execute(pool)
        .await
        .store()?;
        Ok(Self {
            pool: pool.clone(),
            table,
        })
    }

    /// Records an effect on `conn` (the inbox transaction).
    pub async fn record(
        &self,
        conn: &mut sqlx::PgConnection,
        partition_key: &str,
        event_id: outbox_core::EventId,
    ) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "INSERT INTO {} (partition_key, event_id) VALUES ($1, $2)",
            self.table
        ))
        .bind(partition_key)
        .bind(event_id.as_uuid())
        .execute(conn)
        .await
        .store()?;
        Ok(())
    }

    /// Committed effects in commit order.
    pub async fn read(&self) -> Result<Vec<(String, outbox_core::EventId)>, StoreError> {
        use sqlx::Row;
        let rows = sqlx::query(&format!(
            "SELECT partition_key, event_id FROM {} ORDER BY seq",
            self.table
        ))
        .fetch_all(&self.pool)
        .await
        .store()?;
        rows.iter()
            .map(|r| {
                let id: uuid::Uuid = r.try_get("event_id").store()?;
                Ok((
                    r.try_get("partition_key").store()?,
                    outbox_core::EventId::from_uuid(id),
                ))
            })
            .collect()
    }

    /// Waits (polling the table) until at least `n` effects committed;
    /// panics after `deadline`.
    pub async fn wait_for(&self, n: usize, deadline: std::time::Duration) {
        let waited = tokio::time::timeout(deadline, async {
            while self.read().await.expect("read effects").len() < n {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "timed out after {deadline:?} waiting for {n} effects"
        );
    }
}
