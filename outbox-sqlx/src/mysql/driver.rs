//! sqlx as `outbox-sql`'s MySQL driver: binds the protocol's parameters
//! and reads its rows; the protocol itself is `outbox_sql::mysql::Protocol`.

use std::ops::DerefMut;

use async_trait::async_trait;
use outbox_core::StoreError;
use outbox_sql::mysql::{Driver, Exec, Param, Row, Value};
use sqlx::mysql::{MySqlDatabaseError, MySqlRow};
use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlConnection, MySqlPool, Transaction, TypeInfo, ValueRef};

use crate::error::ResultExt;
use crate::scalars::bind;

/// MySQL's error number for a duplicate key.
const DUPLICATE_KEY: u16 = 1062;

/// A pool as the protocol's driver.
#[derive(Clone, Debug)]
pub(crate) struct SqlxDriver(pub(crate) MySqlPool);

/// The caller's connection (`&mut MySqlConnection`, inside their own
/// transaction) as the protocol runs statements on it.
pub(crate) struct Sqlx<C>(pub(crate) C);

impl<C> Sqlx<C> {
    /// The caller's connection (their transaction).
    pub(crate) fn caller(conn: C) -> Self {
        Self(conn)
    }
}

/// A pooled connection or transaction of the store's own, whose every
/// statement runs to completion on a task of its own.
///
/// sqlx-mysql 0.8.6 is not safe to cut inside a statement: one dropped
/// while it is being prepared (the first use of a statement on a new
/// connection) leaves the connection out of step with the server, and the
/// pool's release ping then waits forever, keeping a slot of the pool; a
/// few relays aborted mid-claim exhausted a test's pool. On a task of its
/// own the statement always finishes. A caller dropped meanwhile still
/// stops between statements: the task then drops the connection, and a
/// transaction rolls back as it would have.
pub(crate) struct Owned<C>(Option<C>);

impl<C> Owned<C>
where
    C: DerefMut<Target = MySqlConnection> + Send + 'static,
{
    fn new(conn: C) -> Self {
        Self(Some(conn))
    }

    /// The connection; gone only if a statement's task died with it.
    fn take(&mut self) -> Result<C, StoreError> {
        self.0.take().ok_or_else(|| {
            StoreError::Unavailable("the connection was lost with a statement's task".into())
        })
    }

    /// Runs `statement` on the connection on a task of its own; the task
    /// hands the connection back with the answer.
    async fn on_task<T, Fut>(
        &mut self,
        statement: impl FnOnce(C) -> Fut,
    ) -> Result<Result<T, sqlx::Error>, StoreError>
    where
        Fut: std::future::Future<Output = (C, Result<T, sqlx::Error>)> + Send + 'static,
        T: Send + 'static,
    {
        let conn = self.take()?;
        let (conn, answer) = tokio::spawn(statement(conn))
            .await
            .map_err(|join| StoreError::Unavailable(Box::new(join)))?;
        self.0 = Some(conn);
        Ok(answer)
    }

    /// `sql` as an `execute` on a task of its own: the rows it changed.
    async fn changed(
        &mut self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Result<u64, sqlx::Error>, StoreError> {
        let sql = sql.to_owned();
        self.on_task(|mut conn| async move {
            let done = bind(&sql, &params).execute(&mut *conn).await;
            (conn, done.map(|d| d.rows_affected()))
        })
        .await
    }
}

impl Owned<Transaction<'static, MySql>> {
    /// Commits on a task of its own, for the same reason.
    async fn commit(mut self) -> Result<(), StoreError> {
        let tx = self.take()?;
        tokio::spawn(tx.commit())
            .await
            .map_err(|join| StoreError::Unavailable(Box::new(join)))?
            .store()
    }
}

/// `execute`'s answer to a duplicate key: `false`, the rest as errors.
fn inserted(done: Result<u64, sqlx::Error>) -> Result<bool, StoreError> {
    match done {
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
    crate::scalars::named_rows(rows, value)
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
        inserted(
            bind(sql, &params)
                .execute(&mut *self.0)
                .await
                .map(|done| done.rows_affected()),
        )
    }
}

#[async_trait]
impl<C> Exec for Owned<C>
where
    C: DerefMut<Target = MySqlConnection> + Send + 'static,
{
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError> {
        self.changed(sql, params).await?.store()
    }

    async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError> {
        let sql = sql.to_owned();
        let found = self
            .on_task(|mut conn| async move {
                let found = bind(&sql, &params).fetch_all(&mut *conn).await;
                (conn, found)
            })
            .await?
            .store()?;
        rows(&found)
    }

    async fn insert_unique(&mut self, sql: &str, params: Vec<Param>) -> Result<bool, StoreError> {
        inserted(self.changed(sql, params).await?)
    }
}

#[async_trait]
impl Driver for SqlxDriver {
    type Conn = Owned<PoolConnection<MySql>>;
    type Tx = Owned<Transaction<'static, MySql>>;

    async fn connect(&self) -> Result<Self::Conn, StoreError> {
        self.0.acquire().await.store().map(Owned::new)
    }

    async fn begin(&self, read_committed: bool) -> Result<Self::Tx, StoreError> {
        if !read_committed {
            return crate::pool::begin(&self.0).await.map(Owned::new);
        }
        let pool = self.0.clone();
        crate::pool::begin_to_completion(async move {
            let mut conn = pool.acquire().await?;
            // Applies to this connection's next transaction only, so it
            // runs to completion with the BEGIN after it.
            sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .execute(&mut *conn)
                .await?;
            // `Pool::begin` cannot take a connection prepared this way.
            Transaction::begin(conn, None).await
        })
        .await
        .map(Owned::new)
    }

    async fn commit(tx: Self::Tx) -> Result<(), StoreError> {
        tx.commit().await
    }
}
