//! sqlx as `outbox-sql`'s PostgreSQL driver: binds the protocol's
//! parameters and reads its rows; the protocol itself is
//! `outbox_sql::postgres::Protocol`, the one the Diesel store runs.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{EventId, RawEvent, StoreError};
use outbox_sql::postgres::{Driver, Exec, LOCK_NOT_AVAILABLE, Param, Row, Value};
use outbox_sql::settle::ClaimRow;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Column, PgConnection, PgPool, Postgres, Transaction, TypeInfo, ValueRef};

use crate::error::ResultExt;

/// A pool as the protocol's driver.
#[derive(Clone, Debug)]
pub(crate) struct SqlxDriver {
    pub(crate) pool: PgPool,
    /// Whether claims and settlements run on connections kept apart from
    /// the pool (see `PgStore::without_kept_connections`).
    pub(crate) keeps: bool,
}

/// A connection the protocol runs statements on: pooled, in a transaction,
/// kept, or the caller's `&mut PgConnection` inside their own transaction;
/// and whether its statements are prepared and cached on the connection.
///
/// A store without kept connections shares its pool with many others (a
/// fleet's tenants, each schema's statements distinct): their statements
/// would evict each other from every connection's cache (100 by
/// default), so each would be prepared anew in an extra round trip and
/// transaction. Unprepared, each runs in one.
pub(crate) struct Sqlx<C>(pub(crate) C, pub(crate) Prepared);

/// Whether a connection's statements are prepared and cached.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Prepared {
    /// Prepared once per connection (a store with kept connections, the
    /// caller's connection).
    Cached,
    /// Sent unprepared (a store without kept connections).
    Unprepared,
}

impl<C> Sqlx<C> {
    /// The caller's connection (their transaction): statements prepared.
    pub(crate) fn caller(conn: C) -> Self {
        Self(conn, Prepared::Cached)
    }
}

impl SqlxDriver {
    fn prepared(&self) -> Prepared {
        if self.keeps {
            Prepared::Cached
        } else {
            Prepared::Unprepared
        }
    }
}

/// A connection of the store's own: from the pool, or kept for one kind of
/// relay statement.
///
/// Kept connections are taken from the pool (its connect options and
/// `after_connect` apply) and then detached: closing the pool must not wait
/// for a store that is merely idle, so they count beside the pool's
/// `max_connections`, not in it, and are let go once the pool is closed.
pub(crate) enum Own {
    Pooled(PoolConnection<Postgres>),
    Kept(Box<PgConnection>),
}

impl Deref for Own {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match self {
            Self::Pooled(conn) => conn,
            Self::Kept(conn) => conn,
        }
    }
}

impl DerefMut for Own {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Self::Pooled(conn) => conn,
            Self::Kept(conn) => conn,
        }
    }
}

type Query<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

fn bind(sql: &str, params: Vec<Param>, prepared: Prepared) -> Query<'_> {
    let query = sqlx::query(sql).persistent(matches!(prepared, Prepared::Cached));
    params.into_iter().fold(query, |query, param| match param {
        Param::BigInt(n) => query.bind(n),
        Param::Int(n) => query.bind(n),
        Param::Bool(b) => query.bind(b),
        Param::Text(t) => query.bind(t),
        Param::OptText(t) => query.bind(t),
        Param::OptBigInt(n) => query.bind(n),
        Param::Uuid(u) => query.bind(u),
        Param::Time(t) => query.bind(t),
        Param::BigInts(v) => query.bind(v),
        Param::OptBigInts(v) => query.bind(v),
        Param::Ints(v) => query.bind(v),
        Param::Bools(v) => query.bind(v),
        Param::Texts(v) => query.bind(v),
        Param::OptTexts(v) => query.bind(v),
        Param::Uuids(v) => query.bind(v),
    })
}

/// The column types the statements return, as the protocol reads them.
#[derive(Clone, Copy)]
enum Kind {
    Int8,
    Int4,
    Int2,
    Bool,
    Text,
    Uuid,
    Time,
    Texts,
}

impl Kind {
    fn of(column: &sqlx::postgres::PgColumn) -> Result<Self, StoreError> {
        Ok(match column.type_info().name() {
            "INT8" => Self::Int8,
            "INT4" => Self::Int4,
            "INT2" => Self::Int2,
            "BOOL" => Self::Bool,
            "TEXT" | "VARCHAR" | "NAME" | "BPCHAR" => Self::Text,
            "UUID" => Self::Uuid,
            "TIMESTAMPTZ" => Self::Time,
            "TEXT[]" | "VARCHAR[]" | "NAME[]" => Self::Texts,
            other => {
                return Err(StoreError::fatal(format!(
                    "column {}: no protocol value for type {other}",
                    column.name()
                )));
            }
        })
    }

    /// The value of column `index` of `row`.
    fn read(self, row: &PgRow, index: usize) -> Result<Value, sqlx::Error> {
        use sqlx::Row as _;
        if row.try_get_raw(index)?.is_null() {
            return Ok(Value::Null);
        }
        Ok(match self {
            Self::Int8 => Value::Int(row.try_get::<i64, _>(index)?),
            Self::Int4 => Value::Int(i64::from(row.try_get::<i32, _>(index)?)),
            Self::Int2 => Value::Int(i64::from(row.try_get::<i16, _>(index)?)),
            Self::Bool => Value::Bool(row.try_get(index)?),
            Self::Text => Value::Text(row.try_get(index)?),
            Self::Uuid => Value::Uuid(row.try_get(index)?),
            Self::Time => Value::Time(row.try_get(index)?),
            Self::Texts => Value::Texts(row.try_get(index)?),
        })
    }
}

/// The rows of a result: each column's kind is read once, from the
/// result's columns, not per value.
fn rows(rows: &[PgRow]) -> Result<Vec<Row>, StoreError> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let columns = sqlx::Row::columns(first);
    let names: Arc<[String]> = columns.iter().map(|c| c.name().to_owned()).collect();
    let kinds = columns
        .iter()
        .map(Kind::of)
        .collect::<Result<Vec<_>, _>>()?;
    rows.iter()
        .map(|r| {
            let values = kinds
                .iter()
                .enumerate()
                .map(|(i, kind)| kind.read(r, i))
                .collect::<Result<_, _>>()
                .store()?;
            Ok(Row::new(names.clone(), values))
        })
        .collect()
}

/// The claim function's columns, in its `RETURNS TABLE` order: rows are
/// read by position (a thousand rows of fifteen columns a batch; looking
/// each up by name was a sixth of the relay's time in the PgQ drain), once
/// the first row's names are checked against this list.
const CLAIM_COLUMNS: [&str; 15] = [
    "crash_looped",
    "sequence",
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "partition_key",
    "payload",
    "payload_version",
    "headers",
    "created_at",
    "available_at",
    "attempts",
    "fencing_token",
    "lease_expires_at",
];

/// A claim's rows, typed (see `Exec::fetch_claimed`).
fn claim_rows(rows: &[PgRow]) -> Result<Vec<ClaimRow>, StoreError> {
    if let Some(first) = rows.first() {
        let names: Vec<&str> = sqlx::Row::columns(first).iter().map(|c| c.name()).collect();
        if names != CLAIM_COLUMNS {
            return Err(StoreError::Config(format!(
                "the claim function returned the columns {names:?}, not {CLAIM_COLUMNS:?}: \
                 the outbox functions are of another version; run migrate() (or `outbox migrate`)"
            )));
        }
    }
    rows.iter().map(claim_row).collect::<Result<_, _>>().store()
}

/// One claim row, by position (see `CLAIM_COLUMNS`).
fn claim_row(row: &PgRow) -> Result<ClaimRow, sqlx::Error> {
    use sqlx::Row as _;
    Ok(ClaimRow {
        raw: RawEvent {
            sequence: row.try_get(1)?,
            event_id: EventId::from_uuid(row.try_get(2)?),
            aggregate_type: row.try_get(3)?,
            aggregate_id: row.try_get(4)?,
            event_type: row.try_get(5)?,
            partition_key: row.try_get(6)?,
            payload: row.try_get(7)?,
            payload_version: i64::from(row.try_get::<i32, _>(8)?),
            headers: row.try_get(9)?,
            created_at: row.try_get(10)?,
            available_at: row.try_get(11)?,
            attempts: i64::from(row.try_get::<i32, _>(12)?),
        },
        crash_looped: row.try_get(0)?,
        fencing_token: row.try_get(13)?,
        lease_expires_at: row.try_get(14)?,
    })
}

#[async_trait]
impl<C> Exec for Sqlx<C>
where
    C: DerefMut<Target = PgConnection> + Send,
{
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError> {
        let done = bind(sql, params, self.1)
            .execute(&mut *self.0)
            .await
            .store()?;
        Ok(done.rows_affected())
    }

    async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError> {
        rows(
            &bind(sql, params, self.1)
                .fetch_all(&mut *self.0)
                .await
                .store()?,
        )
    }

    async fn fetch_claimed(
        &mut self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        let rows = bind(sql, params, self.1)
            .fetch_all(&mut *self.0)
            .await
            .store()?;
        claim_rows(&rows)
    }

    async fn fetch_sequences(
        &mut self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Vec<Option<i64>>, StoreError> {
        let rows = bind(sql, params, self.1)
            .fetch_all(&mut *self.0)
            .await
            .store()?;
        rows.iter()
            .map(|r| sqlx::Row::try_get(r, "sequence"))
            .collect::<Result<_, _>>()
            .store()
    }

    async fn run_script(&mut self, sql: &str) -> Result<bool, StoreError> {
        match sqlx::Executor::execute(&mut *self.0, sqlx::raw_sql(sql)).await {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                Ok(false)
            }
            Err(error) => Err(error).store(),
        }
    }
}

#[async_trait]
impl Driver for SqlxDriver {
    type Conn = Sqlx<Own>;
    type Tx = Sqlx<Transaction<'static, Postgres>>;

    async fn connect(&self) -> Result<Self::Conn, StoreError> {
        let conn = self.pool.acquire().await.store()?;
        Ok(Sqlx(Own::Pooled(conn), self.prepared()))
    }

    async fn keep(&self) -> Result<Option<Self::Conn>, StoreError> {
        if !self.keeps {
            return Ok(None);
        }
        let conn = self.pool.acquire().await.store()?.detach();
        Ok(Some(Sqlx(Own::Kept(Box::new(conn)), self.prepared())))
    }

    fn is_closed(&self) -> bool {
        self.pool.is_closed()
    }

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        let prepared = self.prepared();
        crate::pool::begin(&self.pool)
            .await
            .map(|tx| Sqlx(tx, prepared))
    }

    async fn commit(tx: Self::Tx) -> Result<(), StoreError> {
        tx.0.commit().await.store()
    }
}
