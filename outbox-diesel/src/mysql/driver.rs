//! Diesel as `outbox-sql`'s MySQL driver: binds the protocol's parameters
//! and reads its rows; the protocol itself is
//! `outbox_sql::mysql::Protocol`, the one the sqlx store runs.

use std::sync::Arc;

use diesel::deserialize::{FromSql, QueryableByName};
use diesel::mysql::{Mysql, MysqlType};
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::row::{Field, NamedRow};
use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel_async::AsyncMysqlConnection;
use outbox_core::StoreError;
use outbox_sql::mysql::{Driver, Exec, Param, Row, Value};

pub(crate) use crate::driver::Diesel;
use crate::error::{ResultExt, store_error};

/// A statement with the protocol's parameters bound.
pub(super) fn bind(sql: &str, params: Vec<Param>) -> BoxedSqlQuery<'static, Mysql, SqlQuery> {
    params.into_iter().fold(
        diesel::sql_query(sql).into_boxed(),
        |query, param| match param {
            Param::Int(n) => query.bind::<BigInt, _>(n),
            Param::Text(t) => query.bind::<Text, _>(t),
            Param::Bool(b) => query.bind::<Bool, _>(b),
            Param::Null => query.bind::<Nullable<BigInt>, _>(None::<i64>),
        },
    )
}

/// Any row, read column by column: integers by their wire type, the rest
/// as bytes.
pub(super) struct AnyRow(Row);

impl QueryableByName<Mysql> for AnyRow {
    fn build<'a>(row: &impl NamedRow<'a, Mysql>) -> diesel::deserialize::Result<Self> {
        let count = diesel::row::Row::field_count(row);
        let mut names = Vec::with_capacity(count);
        let mut values = Vec::with_capacity(count);
        for index in 0..count {
            let field = diesel::row::Row::get(row, index).ok_or("a column went missing")?;
            names.push(field.field_name().unwrap_or_default().to_owned());
            values.push(match field.value() {
                None => Value::Null,
                Some(value) => match value.value_type() {
                    MysqlType::String | MysqlType::Blob | MysqlType::Enum | MysqlType::Set => {
                        Value::from_bytes(value.as_bytes().to_vec())
                    }
                    _ => Value::Int(<i64 as FromSql<BigInt, Mysql>>::from_sql(value)?),
                },
            });
        }
        Ok(Self(Row::new(Arc::from(names), values)))
    }
}

pub(super) fn rows(rows: Vec<AnyRow>) -> Vec<Row> {
    rows.into_iter().map(|r| r.0).collect()
}

/// `false` for a duplicate key, the statement's error otherwise.
pub(super) fn unique(result: Result<usize, DieselError>) -> Result<bool, StoreError> {
    match result {
        Ok(_) => Ok(true),
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
        Err(e) => Err(store_error(e)),
    }
}

crate::driver::diesel_exec!(AsyncMysqlConnection, Exec {
    async fn insert_unique(&mut self, sql: &str, params: Vec<Param>) -> Result<bool, StoreError> {
        unique(diesel_async::RunQueryDsl::execute(bind(sql, params), &mut *self.0).await)
    }
});

crate::driver::diesel_driver!(
    AsyncMysqlConnection,
    Driver,
    fn begin(&self, read_committed: bool) {
        let mut conn = self.conn().await?;
        if read_committed {
            // Applies to this connection's next transaction only.
            diesel_async::RunQueryDsl::execute(
                diesel::sql_query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"),
                &mut *conn,
            )
            .await
            .store()?;
        }
        DieselDriver::begin_on(conn).await
    }
);
