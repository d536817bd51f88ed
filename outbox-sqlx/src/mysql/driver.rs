//! sqlx as `outbox-sql`'s MySQL driver: binds the protocol's parameters
//! and reads its rows; the protocol itself is `outbox_sql::mysql::Protocol`.

use std::ops::DerefMut;
use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::StoreError;
use outbox_sql::mysql::{Driver, Exec, Param, Row, Value};
use sqlx::mysql::{MySqlArguments, MySqlDatabaseError, MySqlRow};
use sqlx::pool::PoolConnection;
use sqlx::{Column, MySql, MySqlConnection, MySqlPool, Transaction, TypeInfo, ValueRef};

use crate::error::ResultExt;

/// MySQL's error number for a duplicate key.
const DUPLICATE_KEY: u16 = 1062;

/// A pool as the protocol's driver.
#[derive(Clone, Debug)]
pub(crate) struct SqlxDriver(pub(crate) MySqlPool);

/// A connection the protocol runs statements on: pooled, in a
/// transaction, or the caller's `&mut MySqlConnection`.
pub(crate) struct Sqlx<C>(pub(crate) C);

type Query<'q> = sqlx::query::Query<'q, MySql, MySqlArguments>;

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

/// A column's value: integers by their declared type, the rest as bytes
/// (binary-collated text arrives flagged binary).
fn value(row: &MySqlRow, index: usize) -> Result<Value, StoreError> {
    let raw = sqlx::Row::try_get_raw(row, index).store()?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let integer = {
        let type_info = raw.type_info();
        let name = type_info.name();
        matches!(
            name.split(' ').next(),
            Some("TINYINT" | "SMALLINT" | "MEDIUMINT" | "INT" | "BIGINT" | "BOOLEAN")
        )
    };
    if integer {
        sqlx::Row::try_get::<i64, _>(row, index)
            .map(Value::Int)
            .store()
    } else {
        sqlx::Row::try_get::<Vec<u8>, _>(row, index)
            .map(Value::from_bytes)
            .store()
    }
}

fn rows(rows: &[MySqlRow]) -> Result<Vec<Row>, StoreError> {
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
    C: DerefMut<Target = MySqlConnection> + Send,
{
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError> {
        let done = bind(sql, &params).execute(&mut *self.0).await.store()?;
        Ok(done.rows_affected())
    }

    async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError> {
        rows(&bind(sql, &params).fetch_all(&mut *self.0).await.store()?)
    }

    async fn insert_unique(&mut self, sql: &str, params: Vec<Param>) -> Result<bool, StoreError> {
        match bind(sql, &params).execute(&mut *self.0).await {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(e))
                if e.try_downcast_ref::<MySqlDatabaseError>()
                    .is_some_and(|m| m.number() == DUPLICATE_KEY) =>
            {
                Ok(false)
            }
            Err(e) => Err(e).store(),
        }
    }
}

#[async_trait]
impl Driver for SqlxDriver {
    type Conn = Sqlx<PoolConnection<MySql>>;
    type Tx = Sqlx<Transaction<'static, MySql>>;

    async fn connect(&self) -> Result<Self::Conn, StoreError> {
        self.0.acquire().await.store().map(Sqlx)
    }

    async fn begin(&self, read_committed: bool) -> Result<Self::Tx, StoreError> {
        if !read_committed {
            return self.0.begin().await.store().map(Sqlx);
        }
        let mut conn = self.0.acquire().await.store()?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await
            .store()?;
        // `Pool::begin` cannot take a connection prepared this way; the
        // isolation level applies to this connection's next transaction.
        Transaction::begin(conn, None).await.store().map(Sqlx)
    }

    async fn commit(tx: Self::Tx) -> Result<(), StoreError> {
        tx.0.commit().await.store()
    }
}
