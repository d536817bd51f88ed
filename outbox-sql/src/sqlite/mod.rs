//! SQLite: the schema template, its version, every statement, and the
//! store's protocol over any driver ([`Protocol`](crate::sqlite::Protocol)).

mod admin;
pub mod driver;
mod protocol;
mod queries;
mod relay;
#[cfg(feature = "testing")]
mod testing;

pub use driver::{Driver, Exec, Param, Row, Value};
pub use protocol::{Protocol, Statements};
pub use queries::{EVENT_COLUMNS, Queries};

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

/// The columns of [`EVENT_COLUMNS`], not yet trusted as an event:
/// decoding is [`RawEvent::decode`], per row. SQLite columns take any
/// type, so even a number where text belongs is read as its text here.
pub fn raw_event(row: &mut Row) -> Result<RawEvent, StoreError> {
    Ok(RawEvent {
        sequence: row.int("sequence")?,
        event_id: row.event_id("event_id")?,
        aggregate_type: row.take_loose_text("aggregate_type")?,
        aggregate_id: row.take_loose_text("aggregate_id")?,
        event_type: row.take_loose_text("event_type")?,
        partition_key: row.take_loose_text("partition_key")?,
        payload: row.take_loose_text("payload")?,
        payload_version: row.int("payload_version").unwrap_or(-1),
        headers: row.take_loose_text("headers")?,
        created_at: row.time("created_at")?,
        available_at: row.time("available_at")?,
        attempts: row.int("attempts")?,
    })
}
