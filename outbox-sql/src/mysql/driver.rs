//! What a MySQL driver provides to run the store's protocol
//! ([`super::Protocol`]): statements with positional parameters, rows read
//! by column name, pooled connections and transactions. The sqlx and Diesel
//! adapters each implement these once; everything else (which statement,
//! in which order, what a row means) is the protocol's, so both run the
//! same store.

use async_trait::async_trait;
use outbox_core::StoreError;

pub use crate::param::Param;
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
