//! What a SQLite driver provides to run the store's protocol
//! ([`super::Protocol`]): statements with positional parameters, rows read
//! by column name, pooled connections and `BEGIN IMMEDIATE` transactions.
//! The sqlx adapter implements these; which statement runs when, and what
//! its rows mean, is the protocol's, so another driver (rusqlite, Diesel)
//! would run the same store.

use async_trait::async_trait;
use outbox_core::{RawEvent, StoreError};

pub use crate::param::Param;
pub use crate::row::{Row, Value};

/// Runs statements: a pooled connection, an open transaction, or the
/// caller's connection inside their own transaction. Errors are already
/// the core's, classified by the driver (a busy database is a conflict).
///
/// A driver hands SQLite's dynamically typed values over as they are
/// stored: INTEGER as [`Value::Int`], TEXT as [`Value::Text`], BLOB as
/// bytes, REAL as its decimal text (no statement of the store reads one).
#[async_trait]
pub trait Exec: Send {
    /// Runs a statement; the rows it changed.
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError>;

    /// Runs a query; its rows.
    async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError>;

    /// Runs the claim's read of its rows ([`super::EVENT_COLUMNS`] and
    /// `fencing_token`): each row's token and event, not yet decoded. The
    /// protocol's hottest read, a thousand rows a batch: a driver may read
    /// them typed, without the by-name [`Row`] (the sqlx driver does: the
    /// drain was 10 % slower through `Row`); by default they are read from
    /// [`Exec::fetch`] with [`super::raw_event`].
    async fn fetch_events(
        &mut self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Vec<(i64, RawEvent)>, StoreError> {
        let rows = self.fetch(sql, params).await?;
        rows.into_iter()
            .map(|mut r| Ok((r.int("fencing_token")?, super::raw_event(&mut r)?)))
            .collect()
    }

    /// Runs a script of statements without parameters (the schema).
    async fn run_script(&mut self, sql: &str) -> Result<(), StoreError>;
}

/// A driver's pool: connections and transactions.
#[async_trait]
pub trait Driver: Clone + Send + Sync + 'static {
    /// A pooled connection, outside any transaction.
    type Conn: Exec;
    /// A pooled connection inside an open transaction; dropped without
    /// [`Driver::commit`], it rolls back.
    type Tx: Exec;

    /// A connection from the pool.
    async fn connect(&self) -> Result<Self::Conn, StoreError>;

    /// Begins a transaction with `BEGIN IMMEDIATE`: it takes SQLite's one
    /// write lock up front, so a read-then-write never fails on a stale
    /// snapshot.
    async fn begin(&self) -> Result<Self::Tx, StoreError>;

    /// Commits.
    async fn commit(tx: Self::Tx) -> Result<(), StoreError>;
}
