//! What a MySQL driver provides to run the store's protocol
//! ([`super::Protocol`]): statements with positional parameters, rows read
//! by column name, pooled connections and transactions. The sqlx and Diesel
//! adapters each implement these once; everything else (which statement,
//! in which order, what a row means) is the protocol's, so both run the
//! same store.

use async_trait::async_trait;
use outbox_core::StoreError;

/// A statement parameter. The MySQL statements bind only these.
#[derive(Clone, Debug, PartialEq)]
pub enum Param {
    /// A BIGINT (or any integer column).
    Int(i64),
    /// Text (also JSON documents, event ids).
    Text(String),
    /// A BOOLEAN (TINYINT(1)).
    Bool(bool),
    /// SQL NULL in an integer position.
    Null,
}

impl From<i64> for Param {
    fn from(value: i64) -> Self {
        Self::Int(value)
    }
}

impl From<i32> for Param {
    fn from(value: i32) -> Self {
        Self::Int(i64::from(value))
    }
}

impl From<u32> for Param {
    fn from(value: u32) -> Self {
        Self::Int(i64::from(value))
    }
}

impl From<bool> for Param {
    fn from(value: bool) -> Self {
        Self::Bool(value)
    }
}

impl From<String> for Param {
    fn from(value: String) -> Self {
        Self::Text(value)
    }
}

impl From<&str> for Param {
    fn from(value: &str) -> Self {
        Self::Text(value.to_owned())
    }
}

impl From<Option<i64>> for Param {
    fn from(value: Option<i64>) -> Self {
        value.map_or(Self::Null, Self::Int)
    }
}

impl From<Option<String>> for Param {
    fn from(value: Option<String>) -> Self {
        value.map_or(Self::Null, Self::Text)
    }
}

pub use crate::row::{Row, Value, from_micros};

/// Runs statements: a connection, an open transaction, or the caller's
/// connection inside their own transaction. Errors are already the core's,
/// classified by the driver (deadlocks are conflicts, a lost connection is
/// unavailable).
#[async_trait]
pub trait Exec: Send {
    /// Runs a statement; the rows it changed.
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError>;

    /// Runs a query; its rows.
    async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError>;

    /// Runs an INSERT; `false` if it failed on a duplicate key (MySQL error
    /// 1062), which undoes just that statement.
    async fn insert_unique(&mut self, sql: &str, params: Vec<Param>) -> Result<bool, StoreError>;
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

    /// Begins a transaction; at READ COMMITTED if `read_committed`, else at
    /// the server's default (the relay's own transactions lock only the
    /// rows they touch, never a gap a producer inserts into).
    async fn begin(&self, read_committed: bool) -> Result<Self::Tx, StoreError>;

    /// Commits.
    async fn commit(tx: Self::Tx) -> Result<(), StoreError>;
}
