//! What a MySQL driver provides to run the store's protocol
//! ([`super::Protocol`]): statements with positional parameters, rows read
//! by column name, pooled connections and transactions. The sqlx and Diesel
//! adapters each implement these once; everything else (which statement,
//! in which order, what a row means) is the protocol's, so both run the
//! same store.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::{EventId, StoreError};

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

/// A value as a row carries it: every column the statements read is an
/// integer (booleans are TINYINT, times are microseconds) or text.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// Any integer type.
    Int(i64),
    /// Text, valid UTF-8.
    Text(String),
    /// Bytes that are not UTF-8.
    Bytes(Vec<u8>),
}

impl Value {
    /// Text or binary as the server sent it (binary-collated text arrives
    /// flagged binary): UTF-8 is kept as text, checked once here.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        match String::from_utf8(bytes) {
            Ok(text) => Self::Text(text),
            Err(e) => Self::Bytes(e.into_bytes()),
        }
    }
}

/// One result row: values by column name.
#[derive(Clone, Debug)]
pub struct Row {
    names: Arc<[String]>,
    values: Vec<Value>,
}

impl Row {
    /// A row of `values`, named by `names` in the same order (drivers share
    /// one `names` among the rows of a result).
    pub fn new(names: Arc<[String]>, values: Vec<Value>) -> Self {
        debug_assert_eq!(names.len(), values.len());
        Self { names, values }
    }

    fn value(&self, column: &str) -> Result<&Value, StoreError> {
        self.names
            .iter()
            .position(|n| n == column)
            .map(|i| &self.values[i])
            .ok_or_else(|| StoreError::fatal(format!("no column {column} in the row")))
    }

    /// A nullable integer.
    pub fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Int(n) => Ok(Some(*n)),
            // A DECIMAL (what SUM gives) travels as text.
            Value::Text(t) => t
                .parse()
                .map(Some)
                .map_err(|_| StoreError::fatal(format!("column {column} is not an integer"))),
            Value::Bytes(_) => Err(StoreError::fatal(format!(
                "column {column} is not an integer"
            ))),
        }
    }

    /// An integer.
    pub fn int(&self, column: &str) -> Result<i64, StoreError> {
        self.opt_int(column)?
            .ok_or_else(|| StoreError::fatal(format!("column {column} is NULL")))
    }

    /// A BOOLEAN.
    pub fn bool(&self, column: &str) -> Result<bool, StoreError> {
        Ok(self.int(column)? != 0)
    }

    /// Nullable text, as UTF-8.
    pub fn opt_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Int(n) => Ok(Some(n.to_string())),
            Value::Text(t) => Ok(Some(t.clone())),
            Value::Bytes(_) => Err(StoreError::fatal(format!(
                "column {column} is not UTF-8 text"
            ))),
        }
    }

    /// Text, as UTF-8.
    pub fn text(&self, column: &str) -> Result<String, StoreError> {
        self.opt_text(column)?
            .ok_or_else(|| StoreError::fatal(format!("column {column} is NULL")))
    }

    /// An event id stored as text.
    pub fn event_id(&self, column: &str) -> Result<EventId, StoreError> {
        let text = self.text(column)?;
        text.parse()
            .map_err(|e| StoreError::fatal(format!("stored event id {text:?}: {e}")))
    }

    /// A time stored as microseconds since the epoch.
    pub fn time(&self, column: &str) -> Result<DateTime<Utc>, StoreError> {
        from_micros(self.int(column)?)
    }
}

/// Times are stored as microseconds since the Unix epoch: integers compare
/// and index exactly, unlike text timestamps of varying precision.
pub fn from_micros(micros: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::fatal(format!("stored time {micros} out of range")))
}

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
