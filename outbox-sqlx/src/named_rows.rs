//! sqlx rows as `outbox-sql`'s [`Row`]s, for the drivers that read each
//! value by what it holds (MySQL, SQLite).

use std::sync::Arc;

use outbox_core::StoreError;
use outbox_sql::row::{Row, Value};
use sqlx::Column;

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
