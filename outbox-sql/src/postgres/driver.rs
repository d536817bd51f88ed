//! What a PostgreSQL driver provides to run the store's protocol
//! ([`super::Protocol`]): statements with typed positional parameters,
//! rows read by column name, pooled connections and transactions. The sqlx
//! and Diesel adapters each implement these once; which statement runs
//! when, and what its rows mean, is the protocol's, so both run the same
//! store.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::{EventId, StoreError};
use uuid::Uuid;

/// A statement parameter, typed as the statements declare it (PostgreSQL
/// infers nothing from an untyped parameter inside a function call).
#[derive(Clone, Debug, PartialEq)]
pub enum Param {
    /// `bigint`.
    BigInt(i64),
    /// `integer`.
    Int(i32),
    /// `boolean`.
    Bool(bool),
    /// `text`.
    Text(String),
    /// `text`, or NULL.
    OptText(Option<String>),
    /// `bigint`, or NULL.
    OptBigInt(Option<i64>),
    /// `uuid`.
    Uuid(Uuid),
    /// `timestamptz`.
    Time(DateTime<Utc>),
    /// `bigint[]`.
    BigInts(Vec<i64>),
    /// `bigint[]` with NULL elements.
    OptBigInts(Vec<Option<i64>>),
    /// `integer[]`.
    Ints(Vec<i32>),
    /// `boolean[]`.
    Bools(Vec<bool>),
    /// `text[]`.
    Texts(Vec<String>),
    /// `text[]`, or NULL.
    OptTexts(Option<Vec<String>>),
    /// `uuid[]`.
    Uuids(Vec<Uuid>),
}

impl From<i64> for Param {
    fn from(value: i64) -> Self {
        Self::BigInt(value)
    }
}

impl From<i32> for Param {
    fn from(value: i32) -> Self {
        Self::Int(value)
    }
}

impl From<bool> for Param {
    fn from(value: bool) -> Self {
        Self::Bool(value)
    }
}

impl From<&str> for Param {
    fn from(value: &str) -> Self {
        Self::Text(value.to_owned())
    }
}

impl From<String> for Param {
    fn from(value: String) -> Self {
        Self::Text(value)
    }
}

impl From<EventId> for Param {
    fn from(value: EventId) -> Self {
        Self::Uuid(*value.as_uuid())
    }
}

/// Text columns of a batch, owned (`&str` columns are copied once here).
pub fn texts<S: AsRef<str>>(values: impl IntoIterator<Item = S>) -> Param {
    Param::Texts(values.into_iter().map(|s| s.as_ref().to_owned()).collect())
}

/// A value as a row carries it: the column types the statements return.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// `smallint`, `integer` or `bigint`.
    Int(i64),
    /// `boolean`.
    Bool(bool),
    /// `text`, `varchar`, `name`.
    Text(String),
    /// `uuid`.
    Uuid(Uuid),
    /// `timestamptz`.
    Time(DateTime<Utc>),
    /// `text[]` (also `name[]`, `varchar[]`).
    Texts(Vec<String>),
}

/// One result row: values by column name.
#[derive(Clone, Debug)]
pub struct Row {
    names: Arc<[String]>,
    values: Vec<Value>,
}

fn wrong_type(column: &str, expected: &str, found: &Value) -> StoreError {
    StoreError::fatal(format!(
        "column {column}: expected {expected}, found {found:?}"
    ))
}

fn null(column: &str) -> StoreError {
    StoreError::fatal(format!("column {column} is NULL"))
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
            other => Err(wrong_type(column, "an integer", other)),
        }
    }

    /// An integer.
    pub fn int(&self, column: &str) -> Result<i64, StoreError> {
        self.opt_int(column)?.ok_or_else(|| null(column))
    }

    /// A count: NULL (an empty aggregate) is zero.
    pub fn count(&self, column: &str) -> Result<u64, StoreError> {
        Ok(self.opt_int(column)?.unwrap_or(0).max(0) as u64)
    }

    /// A boolean.
    pub fn bool(&self, column: &str) -> Result<bool, StoreError> {
        match self.value(column)? {
            Value::Bool(b) => Ok(*b),
            Value::Null => Err(null(column)),
            other => Err(wrong_type(column, "a boolean", other)),
        }
    }

    /// Nullable text.
    pub fn opt_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Text(t) => Ok(Some(t.clone())),
            other => Err(wrong_type(column, "text", other)),
        }
    }

    /// Text.
    pub fn text(&self, column: &str) -> Result<String, StoreError> {
        self.opt_text(column)?.ok_or_else(|| null(column))
    }

    /// A nullable event id (`uuid`).
    pub fn opt_event_id(&self, column: &str) -> Result<Option<EventId>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Uuid(u) => Ok(Some(EventId::from_uuid(*u))),
            other => Err(wrong_type(column, "a uuid", other)),
        }
    }

    /// An event id (`uuid`).
    pub fn event_id(&self, column: &str) -> Result<EventId, StoreError> {
        self.opt_event_id(column)?.ok_or_else(|| null(column))
    }

    /// A nullable `timestamptz`.
    pub fn opt_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Time(t) => Ok(Some(*t)),
            other => Err(wrong_type(column, "a timestamptz", other)),
        }
    }

    /// A `timestamptz`.
    pub fn time(&self, column: &str) -> Result<DateTime<Utc>, StoreError> {
        self.opt_time(column)?.ok_or_else(|| null(column))
    }

    /// A `text[]`; NULL is empty.
    pub fn texts(&self, column: &str) -> Result<Vec<String>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(Vec::new()),
            Value::Texts(t) => Ok(t.clone()),
            other => Err(wrong_type(column, "a text array", other)),
        }
    }
}

/// Runs statements: a pooled connection, an open transaction, or the
/// caller's connection inside their own transaction. Errors are already
/// the core's, classified by the driver (serialization failures and
/// deadlocks are conflicts, a lost connection is unavailable).
#[async_trait]
pub trait Exec: Send {
    /// Runs a statement; the rows it changed.
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError>;

    /// Runs a query; its rows.
    async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError>;

    /// Runs a script of statements without parameters (the schema, as the
    /// simple query protocol takes it); `false` if a lock was not granted
    /// within `lock_timeout` (SQLSTATE 55P03): the caller rolls back.
    async fn run_script(&mut self, sql: &str) -> Result<bool, StoreError>;
}

/// A driver's pool: connections and transactions.
#[async_trait]
pub trait Driver: Clone + Send + Sync + 'static {
    /// A connection outside any transaction.
    type Conn: Exec;
    /// A connection inside an open transaction; dropped without
    /// [`Driver::commit`], it rolls back.
    type Tx: Exec;

    /// A connection from the pool.
    async fn connect(&self) -> Result<Self::Conn, StoreError>;

    /// A connection the store keeps for one kind of relay statement (claims,
    /// settlements), or `None` if this driver takes one from its pool for
    /// each. The claim and settlement functions are planned once per
    /// connection; a kept one keeps the plans warm (tens of milliseconds
    /// for the claim's).
    async fn keep(&self) -> Result<Option<Self::Conn>, StoreError> {
        Ok(None)
    }

    /// Whether the pool was closed (kept connections are let go then).
    fn is_closed(&self) -> bool {
        false
    }

    /// Begins a transaction.
    async fn begin(&self) -> Result<Self::Tx, StoreError>;

    /// Commits.
    async fn commit(tx: Self::Tx) -> Result<(), StoreError>;
}
