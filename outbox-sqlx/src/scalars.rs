//! sqlx for the dialects whose statements bind scalars and whose values
//! are read by what they hold (MySQL, SQLite): parameters bound, rows as
//! `outbox-sql`'s [`Row`]s.

use std::sync::Arc;

use outbox_core::StoreError;
use outbox_sql::param::Param;
use outbox_sql::row::{Row, Value};
use sqlx::{Column, Database, Encode, Type};

/// `sql` with `params` bound in order.
pub(crate) fn bind<'q, DB>(
    sql: &'q str,
    params: &'q [Param],
) -> sqlx::query::Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    i64: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    bool: Encode<'q, DB> + Type<DB>,
    Option<i64>: Encode<'q, DB> + Type<DB>,
{
    params
        .iter()
        .fold(sqlx::query(sql), |query, param| match param {
            Param::Int(n) => query.bind(*n),
            Param::Text(t) => query.bind(t.as_str()),
            Param::Bool(b) => query.bind(*b),
            Param::Null => query.bind(None::<i64>),
        })
}

/// `rows` with their column names (shared by every row of the result) and
/// each value as `value` reads it.
pub(crate) fn named_rows<R: sqlx::Row>(
    rows: &[R],
    value: impl Fn(&R, usize) -> Result<Value, StoreError>,
) -> Result<Vec<Row>, StoreError> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let names: Arc<[String]> = first
        .columns()
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
