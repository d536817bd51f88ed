//! [`SqliteStore`]: the outbox on SQLite, on `outbox-sql`'s SQLite
//! protocol over sqlx.

use std::str::FromStr;
use std::time::Duration;

use outbox_core::store::EnqueueOutcome;
use outbox_core::{NewEvent, Ordering, StoreError};
use outbox_sql::sqlite::Protocol;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};

use super::driver::{Sqlx, SqlxDriver};
use crate::config::{Migrated, StoreConfig};
use crate::error::ResultExt;

/// The outbox, attempt history, inbox and relay tables in a SQLite file.
///
/// SQLite has one writer at a time: claims run in `BEGIN IMMEDIATE`
/// transactions, so leases and fencing hold across every process sharing the
/// file (open it in WAL mode with a busy timeout, as [`SqliteStore::open`]
/// does), and insert order is commit order. Store time is the clock of the
/// host the file is on, read in SQL (never a clock a caller injects).
#[derive(Clone)]
pub struct SqliteStore {
    pub(super) protocol: Protocol<SqlxDriver>,
}

outbox_sql::delegate_sql_store!(SqliteStore, protocol);

impl SqliteStore {
    /// A store over `pool`. Refuses a schema in the table names (SQLite has
    /// none; use a prefix).
    pub fn new(pool: SqlitePool, config: StoreConfig) -> Result<Self, StoreError> {
        Ok(Self {
            protocol: Protocol::new(SqlxDriver(pool), config)?,
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
        &self.protocol.driver.0
    }

    /// The statement that finds a claim's candidates, for `EXPLAIN QUERY
    /// PLAN` and review. Parameters: `?1` now (microseconds), `?2` limit.
    pub fn claim_statement(&self, ordering: Ordering) -> &str {
        match ordering {
            Ordering::PerKey => &self.protocol.queries.claim_per_key,
            Ordering::Unordered => &self.protocol.queries.claim_unordered,
        }
    }

    /// The schema DDL for these table names (what [`SqliteStore::migrate`] runs).
    pub fn schema_sql(&self) -> String {
        self.protocol.schema_sql()
    }

    /// Creates the tables and indexes if missing. Idempotent; reports the
    /// schema version found and left. Tables of another schema version are
    /// refused with [`StoreError::Config`] naming the upgrade notes.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        self.protocol.migrate().await
    }

    /// Tests shift store time ([`outbox_core::StoreTime::Shifted`]): the
    /// shift is kept in the database, so every handle agrees.
    pub(super) async fn sync_clock(&self) -> Result<(), StoreError> {
        self.protocol.sync_clock().await
    }

    /// A write transaction that takes SQLite's write lock up front, so a
    /// read-then-write never fails on a stale snapshot.
    pub async fn begin_immediate(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.pool().begin_with("BEGIN IMMEDIATE").await.store()
    }

    /// Enqueues `events` on `conn`, typically `&mut *tx` of the business
    /// transaction, in one statement. Invalid events are refused before
    /// anything is sent.
    pub async fn enqueue(
        &self,
        conn: &mut SqliteConnection,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        self.protocol.enqueue(&mut Sqlx(conn), events).await
    }
}
