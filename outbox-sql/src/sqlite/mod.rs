//! SQLite: the schema template, its version, every statement, and the
//! store's protocol over any driver ([`Protocol`](crate::sqlite::Protocol)).

mod admin;
pub mod driver;
mod protocol;
mod queries;
mod relay;
#[cfg(feature = "testing")]
mod testing;

pub use crate::admin_queries::EVENT_COLUMNS;
pub use driver::{Driver, Exec, Param, Row, Value};
pub use protocol::{Protocol, Statements};
pub use queries::Queries;

use outbox_core::{RawEvent, StoreError};

use crate::config::TableNames;

/// The schema template, written with the default names.
pub const SCHEMA: &str = include_str!("schema.sql");

/// The schema version the template creates.
pub const SCHEMA_VERSION: i32 = 2;

/// Columns added since schema version 2 was first released, as (table
/// suffix, column, definition): `migrate()` adds them to older tables
/// (`CREATE TABLE IF NOT EXISTS` leaves an existing table as it is).
pub const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("events", "suspect_span", "INTEGER NOT NULL DEFAULT 0"),
    ("relays", "outage_since", "INTEGER"),
    ("relays", "outage_destination", "TEXT"),
    ("relays", "outage_reason", "TEXT"),
];

/// The schema DDL for these table names.
pub fn schema_sql(tables: &TableNames) -> String {
    tables.render(SCHEMA)
}

/// The columns of [`EVENT_COLUMNS`], not yet trusted as an event (see
/// [`Row::raw_event`]): SQLite columns take any type, so they read loose.
pub fn raw_event(row: &mut Row) -> Result<RawEvent, StoreError> {
    row.raw_event(true)
}
