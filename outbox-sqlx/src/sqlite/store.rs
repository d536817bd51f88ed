//! [`SqliteStore`]: the outbox on SQLite.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::store::{EnqueueOutcome, OutboxWriter, SettleReport};
use outbox_core::{EventId, NewEvent, Ordering, StoreError};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool, Transaction};

use super::queries::Queries;
use super::row;
use crate::config::{Migrated, StoreConfig};
use crate::error::ResultExt;
use crate::history::HistoryEntry;
use crate::validate::{check_event, headers_json};

/// The version of the schema the store creates; tables of another version
/// are refused by `migrate` (see the CHANGELOG's upgrade notes).
pub use outbox_sql::sqlite::SCHEMA_VERSION;

/// The outbox, attempt history, inbox and relay tables in a SQLite file.
///
/// SQLite has one writer at a time: claims run in `BEGIN IMMEDIATE`
/// transactions, so leases and fencing hold across every process sharing the
/// file (open it in WAL mode with a busy timeout, as [`SqliteStore::open`]
/// does), and insert order is commit order. Store time is the clock of the
/// host the file is on, read in SQL (never a clock a caller injects).
#[derive(Clone)]
pub struct SqliteStore {
    pub(super) pool: SqlitePool,
    pub(super) config: StoreConfig,
    pub(super) queries: Arc<Queries>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("tables", &self.config.tables)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// A store over `pool`. Refuses a schema in the table names (SQLite has
    /// none; use a prefix).
    pub fn new(pool: SqlitePool, config: StoreConfig) -> Result<Self, StoreError> {
        if config.tables.schema().is_some() {
            return Err(StoreError::Config(
                "SQLite tables take a prefix, not a schema".into(),
            ));
        }
        let queries = Arc::new(Queries::new(&config.tables));
        Ok(Self {
            pool,
            config,
            queries,
        })
    }

    /// Opens (creating if missing) the database file at `path` in WAL mode
    /// with a 5 s busy timeout and [`crate::guard_cancelled_transactions`],
    /// and returns a store on it with `config`.
    pub async fn open(path: &str, config: StoreConfig) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))
            .store()?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        // On release too, not only on acquire: a connection left inside a
        // transaction holds SQLite's single write lock until it is closed.
        // The ping lets a queued, cancelled BEGIN finish before the check.
        let options_with_release_check = SqlitePoolOptions::new().after_release(|conn, _meta| {
            Box::pin(async move {
                sqlx::Connection::ping(conn).await?;
                Ok(!sqlx::Connection::is_in_transaction(conn))
            })
        });
        let pool = crate::guard_cancelled_transactions(options_with_release_check)
            .max_connections(8)
            .connect_with(options)
            .await
            .store()?;
        Self::new(pool, config)
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The settings.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The statement that finds a claim's candidates, for `EXPLAIN QUERY
    /// PLAN` and review. Parameters: `?1` now (microseconds), `?2` limit.
    pub fn claim_statement(&self, ordering: Ordering) -> &str {
        match ordering {
            Ordering::PerKey => &self.queries.claim_per_key,
            Ordering::Unordered => &self.queries.claim_unordered,
        }
    }

    /// The schema DDL for these table names (what [`SqliteStore::migrate`] runs).
    pub fn schema_sql(&self) -> String {
        outbox_sql::sqlite::schema_sql(&self.config.tables)
    }

    /// Creates the tables and indexes if missing. Idempotent; reports the
    /// schema version found and left. Tables of another schema version are
    /// refused with [`StoreError::Config`] naming the upgrade notes.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        crate::error::during("migrate", || self.config().tables.events(), async move {
            let schema = self.schema_sql();
            let mut tx = self.begin_immediate().await?;
            let found = self.installed_version(&mut tx).await?;
            let migrated = crate::config::check_schema_version(
                &self.config.tables.events(),
                found,
                SCHEMA_VERSION,
            )?;
            sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&schema))
                .await
                .store()?;
            for (suffix, column, definition) in outbox_sql::sqlite::ADDED_COLUMNS {
                let table = self.config.tables.table(suffix);
                let present: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2",
                )
                .bind(&table)
                .bind(column)
                .fetch_one(&mut *tx)
                .await
                .store()?;
                if present == 0 {
                    sqlx::query(&format!(
                        "ALTER TABLE {table} ADD COLUMN {column} {definition}"
                    ))
                    .execute(&mut *tx)
                    .await
                    .store()?;
                }
            }
            tx.commit().await.store()?;
            Ok(migrated)
        })
        .await
    }

    /// The schema version of the outbox tables: `None` if there are none,
    /// 1 for tables made before the version record existed.
    pub async fn schema_version(&self) -> Result<Option<i32>, StoreError> {
        let mut conn = self.pool.acquire().await.store()?;
        self.installed_version(&mut conn).await
    }

    async fn installed_version(
        &self,
        conn: &mut SqliteConnection,
    ) -> Result<Option<i32>, StoreError> {
        let tables = &self.config.tables;
        let present = |name: String| {
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            )
            .bind(name)
        };
        let events = present(tables.events())
            .fetch_one(&mut *conn)
            .await
            .store()?
            > 0;
        let record = present(tables.table("schema_version"))
            .fetch_one(&mut *conn)
            .await
            .store()?
            > 0;
        let version: Option<i32> = if events && record {
            sqlx::query_scalar(&format!(
                "SELECT MAX(version) FROM {}",
                tables.table("schema_version")
            ))
            .fetch_one(&mut *conn)
            .await
            .store()?
        } else {
            None
        };
        Ok(outbox_sql::config::installed_version(
            events, record, version,
        ))
    }

    /// Store time: this host's clock (plus the shift tests set), in
    /// microseconds since the epoch.
    pub(super) async fn now(&self, conn: &mut SqliteConnection) -> Result<i64, StoreError> {
        sqlx::query_scalar(&self.queries.now)
            .fetch_one(conn)
            .await
            .store()
    }

    /// Tests shift store time ([`outbox_core::StoreTime::Shifted`]): the
    /// shift is kept in the database, so every handle agrees.
    pub(super) async fn sync_clock(&self) -> Result<(), StoreError> {
        if let Some(shift) = self.config.shift_micros() {
            let current: i64 = sqlx::query_scalar(&format!(
                "SELECT clock_shift_us FROM {} WHERE id = 1",
                self.config.tables.table("control")
            ))
            .fetch_one(&self.pool)
            .await
            .store()?;
            if current != shift {
                let mut tx = self.begin_immediate().await?;
                sqlx::query(&self.queries.sync_clock)
                    .bind(shift)
                    .execute(&mut *tx)
                    .await
                    .store()?;
                tx.commit().await.store()?;
            }
        }
        Ok(())
    }

    /// A write transaction that takes SQLite's write lock up front, so a
    /// read-then-write never fails on a stale snapshot.
    pub async fn begin_immediate(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.store()
    }

    /// Enqueues `events` on `conn`, typically `&mut *tx` of the business
    /// transaction, in one statement. Invalid events are refused before
    /// anything is sent.
    pub async fn enqueue(
        &self,
        conn: &mut SqliteConnection,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        crate::error::during("enqueue", || self.config().tables.events(), async move {
            for event in events {
                check_event(event, &self.config.limits, false)?;
            }
            if events.is_empty() {
                return Ok(Vec::new());
            }
            // No clock sync here: it would write, and the caller's transaction
            // holds SQLite's one write lock.
            let now = self.now(&mut *conn).await?;
            let batch: Vec<_> = events
                .iter()
                .map(|e| {
                    json!({
                        "id": e.event_id.to_string(),
                        "at": e.aggregate_type,
                        "ai": e.aggregate_id,
                        "et": e.event_type,
                        "pk": e.partition_key,
                        "p": e.payload.as_str(),
                        "v": e.payload_version,
                        "h": headers_json(e),
                        "d": self.config.delay_ms(e.available_at),
                    })
                })
                .collect();
            let rows = sqlx::query(&self.queries.enqueue)
                .bind(serde_json::Value::Array(batch).to_string())
                .bind(now)
                .fetch_all(&mut *conn)
                .await
                .store()?;
            let mut inserted = HashMap::with_capacity(rows.len());
            for r in &rows {
                inserted.insert(
                    row::event_id(r, "event_id")?,
                    r.try_get::<i64, _>("sequence").store()?,
                );
            }
            Ok(events
                .iter()
                .map(|e| match inserted.remove(&e.event_id) {
                    Some(sequence) => EnqueueOutcome::Inserted { sequence },
                    None => EnqueueOutcome::AlreadyExists,
                })
                .collect())
        })
        .await
    }

    /// Appends history rows in one statement.
    pub(super) async fn record(
        &self,
        conn: &mut SqliteConnection,
        entries: &[HistoryEntry<'_>],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let now = self.now(&mut *conn).await?;
        sqlx::query(&self.queries.record_many)
            .bind(HistoryEntry::batch_json(entries))
            .bind(now)
            .execute(&mut *conn)
            .await
            .store()?;
        Ok(())
    }

    pub(super) async fn settle_json(
        &self,
        query: &str,
        batch: serde_json::Value,
        with_now: bool,
        asked: impl Iterator<Item = EventId>,
    ) -> Result<SettleReport, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let mut q = sqlx::query(query).bind(batch.to_string());
        if with_now {
            q = q.bind(self.now(&mut tx).await?);
        }
        let rows = q.fetch_all(&mut *tx).await.store()?;
        tx.commit().await.store()?;
        let settled: HashSet<EventId> = rows
            .iter()
            .map(|r| row::event_id(r, "event_id"))
            .collect::<Result<_, _>>()?;
        Ok(SettleReport {
            applied: settled.len(),
            fenced: asked.filter(|id| !settled.contains(id)).collect(),
        })
    }
}

#[async_trait]
impl OutboxWriter for SqliteStore {
    async fn enqueue(&self, events: &[NewEvent]) -> Result<Vec<EnqueueOutcome>, StoreError> {
        crate::error::during("enqueue", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let mut tx = self.begin_immediate().await?;
            let outcomes = SqliteStore::enqueue(self, &mut tx, events).await?;
            tx.commit().await.store()?;
            Ok(outcomes)
        })
        .await
    }
}
