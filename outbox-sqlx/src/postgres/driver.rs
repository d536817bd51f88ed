//! sqlx as `outbox-sql`'s PostgreSQL driver: binds the protocol's
//! parameters and reads its rows; the protocol itself is
//! `outbox_sql::postgres::Protocol`, the one the Diesel store runs.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::StoreError;
use outbox_sql::postgres::{Driver, Exec, LOCK_NOT_AVAILABLE, Param, Row, Value};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Column, PgConnection, PgPool, Postgres, Transaction, TypeInfo, ValueRef};

use crate::error::ResultExt;

/// A pool as the protocol's driver.
#[derive(Clone, Debug)]
pub(crate) struct SqlxDriver(pub(crate) PgPool);

/// A connection the protocol runs statements on: pooled, in a transaction,
/// kept, or the caller's `&mut PgConnection` inside their own transaction.
pub(crate) struct Sqlx<C>(pub(crate) C);

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

fn bind(sql: &str, params: Vec<Param>) -> Query<'_> {
    params
        .into_iter()
        .fold(sqlx::query(sql), |query, param| match param {
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

/// A column's value, by its type (the types the statements return).
fn value(row: &PgRow, index: usize) -> Result<Value, StoreError> {
    let raw = sqlx::Row::try_get_raw(row, index).store()?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let type_name = raw.type_info().name().to_owned();
    let get = |row: &PgRow| -> Result<Value, sqlx::Error> {
        use sqlx::Row as _;
        Ok(match type_name.as_str() {
            "INT8" => Value::Int(row.try_get::<i64, _>(index)?),
            "INT4" => Value::Int(i64::from(row.try_get::<i32, _>(index)?)),
            "INT2" => Value::Int(i64::from(row.try_get::<i16, _>(index)?)),
            "BOOL" => Value::Bool(row.try_get(index)?),
            "TEXT" | "VARCHAR" | "NAME" | "BPCHAR" => Value::Text(row.try_get(index)?),
            "UUID" => Value::Uuid(row.try_get(index)?),
            "TIMESTAMPTZ" => Value::Time(row.try_get(index)?),
            "TEXT[]" | "VARCHAR[]" | "NAME[]" => Value::Texts(row.try_get(index)?),
            other => {
                return Err(sqlx::Error::Decode(
                    format!("column {index}: no protocol value for type {other}").into(),
                ));
            }
        })
    };
    get(row).store()
}

fn rows(rows: &[PgRow]) -> Result<Vec<Row>, StoreError> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let names: Arc<[String]> = sqlx::Row::columns(first)
        .iter()
        .map(|c| c.name().to_owned())
        .collect();
    rows.iter()
        .map(|r| {
            let values = (0..names.len())
                .map(|i| value(r, i))
                .collect::<Result<_, _>>()?;
            Ok(Row::new(names.clone(), values))
        })
        .collect()
}

#[async_trait]
impl<C> Exec for Sqlx<C>
where
    C: DerefMut<Target = PgConnection> + Send,
{
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError> {
        let done = bind(sql, params).execute(&mut *self.0).await.store()?;
        Ok(done.rows_affected())
    }

    async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError> {
        rows(&bind(sql, params).fetch_all(&mut *self.0).await.store()?)
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
        let conn = self.0.acquire().await.store()?;
        Ok(Sqlx(Own::Pooled(conn)))
    }

    async fn keep(&self) -> Result<Option<Self::Conn>, StoreError> {
        let conn = self.0.acquire().await.store()?.detach();
        Ok(Some(Sqlx(Own::Kept(Box::new(conn)))))
    }

    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        crate::pool::begin(&self.0).await.map(Sqlx)
    }

    async fn commit(tx: Self::Tx) -> Result<(), StoreError> {
        tx.0.commit().await.store()
    }
}
