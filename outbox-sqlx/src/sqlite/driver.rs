//! sqlx as `outbox-sql`'s SQLite driver: binds the protocol's parameters
//! and reads its rows; the protocol itself is `outbox_sql::sqlite::Protocol`.

use std::ops::DerefMut;

use async_trait::async_trait;
use outbox_core::StoreError;
use outbox_sql::sqlite::{Driver, Exec, Param, Row, Value};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction, TypeInfo, ValueRef};

use crate::error::ResultExt;

/// A pool as the protocol's driver.
#[derive(Clone, Debug)]
pub(crate) struct SqlxDriver(pub(crate) SqlitePool);

/// A connection (pooled, a transaction, or the caller's
/// `&mut SqliteConnection` inside their own transaction) as the protocol
/// runs statements on it.
pub(crate) struct Sqlx<C>(pub(crate) C);

type Query<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>;

fn bind<'q>(sql: &'q str, params: &'q [Param]) -> Query<'q> {
    params
        .iter()
        .fold(sqlx::query(sql), |query, param| match param {
            Param::Int(n) => query.bind(*n),
            Param::Text(t) => query.bind(t.as_str()),
            Param::Bool(b) => query.bind(*b),
            Param::Null => query.bind(None::<i64>),
        })
}

/// A value by the storage class it has (SQLite columns take any type):
/// INTEGER as an integer, TEXT as text, BLOB as bytes, REAL as its text.
fn value(row: &SqliteRow, index: usize) -> Result<Value, StoreError> {
    let raw = sqlx::Row::try_get_raw(row, index).store()?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let class = raw.type_info().name().to_owned();
    Ok(match class.as_str() {
        "INTEGER" | "BOOLEAN" => Value::Int(sqlx::Row::try_get_unchecked(row, index).store()?),
        "REAL" => Value::Text(
            sqlx::Row::try_get_unchecked::<f64, _>(row, index)
                .store()?
                .to_string(),
        ),
        "BLOB" => Value::from_bytes(sqlx::Row::try_get_unchecked(row, index).store()?),
        _ => Value::Text(sqlx::Row::try_get_unchecked(row, index).store()?),
    })
}

fn rows(rows: &[SqliteRow]) -> Result<Vec<Row>, StoreError> {
    crate::named_rows::named_rows(rows, value)
}

#[async_trait]
impl<C> Exec for Sqlx<C>
where
    C: DerefMut<Target = SqliteConnection> + Send,
{
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError> {
        let done = bind(sql, &params).execute(&mut *self.0).await.store()?;
        Ok(done.rows_affected())
    }

    async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError> {
        rows(&bind(sql, &params).fetch_all(&mut *self.0).await.store()?)
    }

    async fn run_script(&mut self, sql: &str) -> Result<(), StoreError> {
        sqlx::Executor::execute(&mut *self.0, sqlx::raw_sql(sql))
            .await
            .store()?;
        Ok(())
    }
}

#[async_trait]
impl Driver for SqlxDriver {
    type Conn = Sqlx<PoolConnection<Sqlite>>;
    type Tx = Sqlx<Transaction<'static, Sqlite>>;

    async fn connect(&self) -> Result<Self::Conn, StoreError> {
        self.0.acquire().await.store().map(Sqlx)
    }

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        self.0.begin_with("BEGIN IMMEDIATE").await.store().map(Sqlx)
    }

    async fn commit(tx: Self::Tx) -> Result<(), StoreError> {
        tx.0.commit().await.store()
    }
}
