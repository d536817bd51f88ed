//! What a PostgreSQL driver provides to run the store's protocol
//! ([`super::Protocol`]): statements with typed positional parameters,
//! rows read by column name, pooled connections and transactions. The sqlx
//! and Diesel adapters each implement these once; which statement runs
//! when, and what its rows mean, is the protocol's, so both run the same
//! store.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::{EventId, StoreError};
use uuid::Uuid;

use crate::settle::ClaimRow;

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

crate::param::param_from!(Param: i64 => BigInt, i32 => Int, bool => Bool, &str => Text, String => Text);

impl From<EventId> for Param {
    fn from(value: EventId) -> Self {
        Self::Uuid(*value.as_uuid())
    }
}

/// Text columns of a batch, owned (`&str` columns are copied once here).
pub fn texts<S: AsRef<str>>(values: impl IntoIterator<Item = S>) -> Param {
    Param::Texts(values.into_iter().map(|s| s.as_ref().to_owned()).collect())
}

pub use crate::row::{Row, Value};

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

    /// Runs a claim, whose rows are claimed events
    /// ([`super::EVENT_COLUMNS`], then `crash_looped`, `fencing_token` and
    /// `lease_expires_at`). The protocol's hottest read, a thousand rows a
    /// batch: a driver may map them typed, without the by-name [`Row`]
    /// (about a microsecond an event, measured); by default they are read
    /// from [`Exec::fetch`].
    async fn fetch_claimed(
        &mut self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        let rows = self.fetch(sql, params).await?;
        rows.into_iter()
            .map(|mut r| super::statements::claim_row(&mut r))
            .collect()
    }

    /// Runs a settlement, whose rows hold a nullable `sequence` each (a
    /// thousand a batch, as [`Exec::fetch_claimed`]).
    async fn fetch_sequences(
        &mut self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Vec<Option<i64>>, StoreError> {
        let rows = self.fetch(sql, params).await?;
        rows.iter().map(|r| r.opt_int("sequence")).collect()
    }

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
