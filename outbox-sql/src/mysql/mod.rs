//! MySQL/MariaDB: the schema template, its version, and every statement.

mod admin;
pub mod driver;
mod protocol;
mod queries;
mod traits;

pub use driver::{Driver, Exec, Param, Row, Value};
pub use protocol::{Protocol, Statements, raw_event};
pub use queries::{EVENT_COLUMNS, Queries, with_in_list};

use crate::config::TableNames;

/// The schema template, written with the default names.
pub const SCHEMA: &str = include_str!("schema.sql");

/// The schema version the template creates.
pub const SCHEMA_VERSION: i32 = 2;

/// The schema DDL for these table names.
pub fn schema_sql(tables: &TableNames) -> String {
    tables.render(SCHEMA)
}

/// The schema as statements to run one at a time (MySQL takes one per
/// call): comment lines dropped, split at `;` (the schema has no
/// procedural bodies), blank statements dropped.
pub fn split_statements(schema: &str) -> Vec<String> {
    let without_comments: String = schema
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    without_comments
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}
