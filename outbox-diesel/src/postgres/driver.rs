//! Diesel as `outbox-sql`'s PostgreSQL driver: binds the protocol's
//! parameters and reads its rows; the protocol itself is
//! `outbox_sql::postgres::Protocol`, the one the sqlx store runs.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use diesel::deserialize::{FromSql, QueryableByName};
use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::row::{Field, NamedRow};
use diesel::sql_types::{
    Array, BigInt, Bool, Integer, Nullable, SmallInt, Text, Timestamptz, Uuid as SqlUuid,
};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use outbox_core::{EventId, RawEvent, StoreError};
use outbox_sql::postgres::{Driver, Exec, Param, Row, Value};
use outbox_sql::settle::ClaimRow;

pub(crate) use crate::driver::Diesel;
use crate::error::{ResultExt, store_error};

/// A statement with the protocol's parameters bound.
fn bind(sql: &str, params: Vec<Param>) -> BoxedSqlQuery<'static, Pg, SqlQuery> {
    params.into_iter().fold(
        diesel::sql_query(sql).into_boxed(),
        |query, param| match param {
            Param::BigInt(n) => query.bind::<BigInt, _>(n),
            Param::Int(n) => query.bind::<Integer, _>(n),
            Param::Bool(b) => query.bind::<Bool, _>(b),
            Param::Text(t) => query.bind::<Text, _>(t),
            Param::OptText(t) => query.bind::<Nullable<Text>, _>(t),
            Param::OptBigInt(n) => query.bind::<Nullable<BigInt>, _>(n),
            Param::Uuid(u) => query.bind::<SqlUuid, _>(u),
            Param::Time(t) => query.bind::<Timestamptz, _>(t),
            Param::BigInts(v) => query.bind::<Array<BigInt>, _>(v),
            Param::OptBigInts(v) => query.bind::<Array<Nullable<BigInt>>, _>(v),
            Param::Ints(v) => query.bind::<Array<Integer>, _>(v),
            Param::Bools(v) => query.bind::<Array<Bool>, _>(v),
            Param::Texts(v) => query.bind::<Array<Text>, _>(v),
            Param::OptTexts(v) => query.bind::<Nullable<Array<Text>>, _>(v),
            Param::Uuids(v) => query.bind::<Array<SqlUuid>, _>(v),
        },
    )
}

/// Type oids of the columns the statements return.
mod oid {
    pub(super) const BOOL: u32 = 16;
    pub(super) const NAME: u32 = 19;
    pub(super) const INT8: u32 = 20;
    pub(super) const INT2: u32 = 21;
    pub(super) const INT4: u32 = 23;
    pub(super) const TEXT: u32 = 25;
    pub(super) const NAME_ARRAY: u32 = 1003;
    pub(super) const TEXT_ARRAY: u32 = 1009;
    pub(super) const VARCHAR_ARRAY: u32 = 1015;
    pub(super) const BPCHAR: u32 = 1042;
    pub(super) const VARCHAR: u32 = 1043;
    pub(super) const TIMESTAMPTZ: u32 = 1184;
    pub(super) const UUID: u32 = 2950;
}

/// Any row, read column by column by each column's type.
struct AnyRow(Row);

thread_local! {
    /// The column names of the last row built on this thread: the rows of
    /// one result share them (compared, not allocated, per row).
    static NAMES: std::cell::RefCell<Arc<[String]>> = std::cell::RefCell::new(Arc::from(Vec::new()));
}

/// `row`'s column names, shared with the previous row's when the same.
fn names<'a>(row: &impl NamedRow<'a, Pg>, count: usize) -> Arc<[String]> {
    let name = |index| {
        diesel::row::Row::get(row, index)
            .and_then(|f| f.field_name().map(str::to_owned))
            .unwrap_or_default()
    };
    NAMES.with(|last| {
        let same = {
            let last = last.borrow();
            last.len() == count
                && (0..count).all(|i| {
                    diesel::row::Row::get(row, i)
                        .is_some_and(|f| f.field_name() == Some(last[i].as_str()))
                })
        };
        if !same {
            *last.borrow_mut() = (0..count).map(name).collect();
        }
        last.borrow().clone()
    })
}

impl QueryableByName<Pg> for AnyRow {
    fn build<'a>(row: &impl NamedRow<'a, Pg>) -> diesel::deserialize::Result<Self> {
        let count = diesel::row::Row::field_count(row);
        let mut values = Vec::with_capacity(count);
        for index in 0..count {
            let field = diesel::row::Row::get(row, index).ok_or("a column went missing")?;
            let Some(value) = field.value() else {
                values.push(Value::Null);
                continue;
            };
            values.push(match value.get_oid().get() {
                oid::INT8 => Value::Int(<i64 as FromSql<BigInt, Pg>>::from_sql(value)?),
                oid::INT4 => Value::Int(i64::from(<i32 as FromSql<Integer, Pg>>::from_sql(value)?)),
                oid::INT2 => {
                    Value::Int(i64::from(<i16 as FromSql<SmallInt, Pg>>::from_sql(value)?))
                }
                oid::BOOL => Value::Bool(<bool as FromSql<Bool, Pg>>::from_sql(value)?),
                oid::TEXT | oid::VARCHAR | oid::NAME | oid::BPCHAR => {
                    Value::Text(<String as FromSql<Text, Pg>>::from_sql(value)?)
                }
                oid::UUID => Value::Uuid(<uuid::Uuid as FromSql<SqlUuid, Pg>>::from_sql(value)?),
                oid::TIMESTAMPTZ => Value::Time(
                    <DateTime<Utc> as FromSql<Timestamptz, Pg>>::from_sql(value)?,
                ),
                oid::TEXT_ARRAY | oid::VARCHAR_ARRAY | oid::NAME_ARRAY => {
                    Value::Texts(<Vec<String> as FromSql<Array<Text>, Pg>>::from_sql(value)?)
                }
                other => {
                    return Err(
                        format!("column {index}: no protocol value for type oid {other}").into(),
                    );
                }
            });
        }
        Ok(Self(Row::new(names(row, count), values)))
    }
}

/// A claim's row, typed (see `Exec::fetch_claimed`): the columns of
/// `EVENT_COLUMNS`, then the lease's.
#[derive(QueryableByName)]
struct ClaimedRow {
    #[diesel(sql_type = BigInt)]
    sequence: i64,
    #[diesel(sql_type = SqlUuid)]
    event_id: uuid::Uuid,
    #[diesel(sql_type = Text)]
    aggregate_type: String,
    #[diesel(sql_type = Text)]
    aggregate_id: String,
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Text)]
    partition_key: String,
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Integer)]
    payload_version: i32,
    #[diesel(sql_type = Text)]
    headers: String,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    available_at: DateTime<Utc>,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Bool)]
    crash_looped: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    fencing_token: Option<i64>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    lease_expires_at: Option<DateTime<Utc>>,
}

impl ClaimedRow {
    fn into_claim_row(self) -> ClaimRow {
        ClaimRow {
            raw: RawEvent {
                sequence: self.sequence,
                event_id: EventId::from_uuid(self.event_id),
                aggregate_type: self.aggregate_type,
                aggregate_id: self.aggregate_id,
                event_type: self.event_type,
                partition_key: self.partition_key,
                payload: self.payload,
                payload_version: i64::from(self.payload_version),
                headers: self.headers,
                created_at: self.created_at,
                available_at: self.available_at,
                attempts: i64::from(self.attempts),
            },
            crash_looped: self.crash_looped,
            fencing_token: self.fencing_token,
            lease_expires_at: self.lease_expires_at,
        }
    }
}

/// A settlement's row.
#[derive(QueryableByName)]
struct Settled {
    #[diesel(sql_type = Nullable<BigInt>)]
    sequence: Option<i64>,
}

/// A statement cancelled by `lock_timeout` (Diesel keeps the server's
/// message, not its SQLSTATE 55P03).
pub(super) fn is_lock_timeout(error: &diesel::result::Error) -> bool {
    matches!(error, diesel::result::Error::DatabaseError(_, info)
        if info.message().contains("lock timeout"))
}

crate::driver::diesel_exec!(AsyncPgConnection, Exec {
    async fn fetch_claimed(
        &mut self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        let rows = diesel_async::RunQueryDsl::load::<ClaimedRow>(bind(sql, params), &mut *self.0)
            .await
            .store()?;
        Ok(rows.into_iter().map(ClaimedRow::into_claim_row).collect())
    }

    async fn fetch_sequences(
        &mut self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Vec<Option<i64>>, StoreError> {
        let rows = diesel_async::RunQueryDsl::load::<Settled>(bind(sql, params), &mut *self.0)
            .await
            .store()?;
        Ok(rows.into_iter().map(|r| r.sequence).collect())
    }

    async fn run_script(&mut self, sql: &str) -> Result<bool, StoreError> {
        match self.0.batch_execute(sql).await {
            Ok(()) => Ok(true),
            Err(error) if is_lock_timeout(&error) => Ok(false),
            Err(error) => Err(store_error(error)),
        }
    }
});

crate::driver::diesel_driver!(
    AsyncPgConnection,
    Driver,
    fn begin(&self) {
        DieselDriver::begin_on(self.conn().await?).await
    }
);
