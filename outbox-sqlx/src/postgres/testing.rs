//! Hooks for the core's conformance suites (feature `testing`).

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::consume::{Consumed, Handler, HandlerError};
use outbox_core::{EventId, ManualClock, NewEvent, StoreError, StoreTime};
use sqlx::{Postgres, Transaction};
use tracing::Instrument;

use super::store::PgStore;
use crate::error::ResultExt;

outbox_sql::sql_fault_seams!(PgStore, protocol);

/// An effects table for end-to-end tests: a consumer's handler records
/// `(partition key, event id)` inside its inbox transaction, and the test
/// reads them back in commit order to check exactly-once and key order.
#[derive(Clone, Debug)]
pub struct EffectLog {
    pool: sqlx::PgPool,
    table: String,
}

impl EffectLog {
    /// Creates `{schema}.effects` (the schema must exist). Each effect
    /// keeps the time it was applied (`applied_at`), for latency reports.
    pub async fn create(pool: &sqlx::PgPool, schema: &str) -> Result<Self, StoreError> {
        let log = Self::open(pool, schema)?;
        sqlx::query(&format!(
            "CREATE TABLE {} (seq BIGSERIAL PRIMARY KEY, partition_key TEXT NOT NULL,
                 event_id UUID NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
            log.table
        ))
        .execute(pool)
        .await
        .store()?;
        Ok(log)
    }

    /// The log another process created in `schema` (a consumer process
    /// of a multi-process run).
    pub fn open(pool: &sqlx::PgPool, schema: &str) -> Result<Self, StoreError> {
        crate::config::check_identifier("schema", schema, 63)?;
        Ok(Self {
            pool: pool.clone(),
            table: format!("{schema}.effects"),
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

/// The consumer's effect in end-to-end tests, for events from any broker:
/// the event recorded in an [`EffectLog`] inside the inbox transaction, in
/// a span of its own (`record_effect`) as application code opens (trace
/// tests find it under the consumer's span). A failure is retried.
#[derive(Clone, Debug)]
pub struct RecordEffect {
    /// Where the effects go.
    pub log: EffectLog,
}

#[async_trait]
impl<E: Consumed + Sync> Handler<Transaction<'static, Postgres>, E> for RecordEffect {
    async fn handle(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        event: &E,
    ) -> Result<(), HandlerError> {
        self.log
            .record(tx, event.partition_key(), event.event_id())
            .instrument(tracing::info_span!("record_effect"))
            .await
            .map_err(|e| HandlerError::Retry(e.to_string()))
    }
}

/// What every end-to-end test over PostgreSQL starts from: an outbox and
/// inbox migrated into a schema of their own on the test database
/// (`OUTBOX_PG_URL`, default the local `outbox_test`), an [`EffectLog`]
/// beside them, and store time shifted by a [`ManualClock`] so a test can
/// expire a dead relay's lease without waiting for it. Panics, naming the
/// URL, when the database cannot be reached.
pub struct EndToEndDb {
    /// The store (its inbox is `store.inbox()`).
    pub store: Arc<PgStore>,
    /// Shifts store time, when created [on a manual
    /// clock](Self::create_on_manual_clock).
    clock: Option<ManualClock>,
    /// The consumers' effects.
    pub log: EffectLog,
    /// The schema holding the tables.
    pub schema: String,
}

impl EndToEndDb {
    /// A fresh schema named `{prefix}_{random}`, on the database's clock.
    pub async fn create(prefix: &str) -> Self {
        Self::create_with_time(prefix, None, StoreTime::Database).await
    }

    /// A fresh schema whose store time is the database's shifted by how far
    /// it was advanced: a test expires a dead relay's
    /// lease with [`advance_store_time`](Self::advance_store_time). Every store operation then also writes the
    /// shift (one shared row), which slows busy runs; use it where a test
    /// moves time.
    pub async fn create_on_manual_clock(prefix: &str) -> Self {
        let clock = ManualClock::at_epoch();
        Self::create_with_time(prefix, Some(clock.clone()), StoreTime::Shifted(clock)).await
    }

    async fn create_with_time(prefix: &str, clock: Option<ManualClock>, time: StoreTime) -> Self {
        let url = std::env::var("OUTBOX_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".into());
        let pool = crate::guard_cancelled_transactions(sqlx::postgres::PgPoolOptions::new())
            .max_connections(12)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL unreachable at {url}: {e}"));
        let schema = format!(
            "{prefix}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&pool)
            .await
            .expect("create the test's schema");
        let log = EffectLog::create(&pool, &schema)
            .await
            .expect("create the effects table");
        let tables = crate::TableNames::default()
            .in_schema(&schema)
            .expect("a valid schema name");
        let store = PgStore::new(
            pool,
            crate::StoreConfig::with_tables(tables).with_time(time),
        );
        store.migrate().await.expect("migrate the test's schema");
        Self {
            store: Arc::new(store),
            clock,
            log,
            schema,
        }
    }

    /// Moves store time `by` for every handle on the store (expires a dead
    /// relay's lease without waiting). Panics on a database created on the
    /// database's clock, where nothing could move it: a test that meant to
    /// expire a lease must not silently wait the lease out instead.
    pub fn advance_store_time(&self, by: std::time::Duration) {
        self.clock
            .as_ref()
            .expect("store time moves only on EndToEndDb::create_on_manual_clock")
            .advance(by);
    }

    /// Committed effects in commit order: (partition key, event id).
    pub async fn effects(&self) -> Vec<(String, EventId)> {
        self.log.read().await.expect("read the effects")
    }

    /// Waits until at least `n` effects committed; panics after `deadline`.
    pub async fn wait_for_effects(&self, n: usize, deadline: std::time::Duration) {
        self.log.wait_for(n, deadline).await;
    }

    /// Waits until every one of `events` is marked published (no relay has
    /// a copy of it still to send); panics after `deadline`.
    pub async fn wait_for_published(&self, events: &[NewEvent], deadline: std::time::Duration) {
        use outbox_core::store::{EventState, OutboxAdmin};
        let waited = tokio::time::timeout(deadline, async {
            for e in events {
                while !matches!(
                    self.store
                        .event_state(e.event_id)
                        .await
                        .expect("read an event's state"),
                    Some(EventState::Published { .. })
                ) {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "timed out after {deadline:?} waiting for {} events to be published",
            events.len()
        );
    }
}
