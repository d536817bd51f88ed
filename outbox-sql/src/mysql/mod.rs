//! MySQL/MariaDB: the schema template, its version, and every statement.

mod admin;
pub mod driver;
mod park;
mod protocol;
mod queries;
mod recovery;
mod statements;
#[cfg(feature = "testing")]
mod testing;

pub use crate::admin_queries::EVENT_COLUMNS;
pub use driver::{Driver, Exec, Param, Row, Value};
pub use protocol::Protocol;
pub use queries::{MAX_LISTED_KEYS, Queries, with_in_list, with_key_ranges, with_keys_in_flight};
pub use statements::{FORGET_OWNERS_EVERY, Statements, raw_event};

use crate::config::TableNames;

/// The schema template, written with the default names.
pub const SCHEMA: &str = include_str!("schema.sql");

/// The schema version the template creates.
pub const SCHEMA_VERSION: i32 = 2;

/// Columns added since schema version 2 was first released, as (table
/// suffix, column, definition): `migrate()` adds them to older tables
/// (`CREATE TABLE IF NOT EXISTS` leaves an existing table as it is).
pub const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("events", "suspect_span", "INT NOT NULL DEFAULT 0"),
    ("relays", "outage_since", "BIGINT NULL"),
    ("relays", "outage_destination", "VARCHAR(255) NULL"),
    ("relays", "outage_reason", "TEXT NULL"),
    ("claim_lock", "flight_from", "BIGINT NOT NULL DEFAULT 0"),
];

/// Column defaults changed since schema version 2 was first released, as
/// (table suffix, column, default as `information_schema` lists it):
/// `migrate()` sets them on older tables. Earlier releases left these
/// columns NULL until a lease or an ack wrote them, and writing a value
/// into a NULL column grows the row (InnoDB moves it within its page or
/// splits the page); this crate's enqueue writes the values itself, rows
/// other tools insert take the defaults.
pub const CHANGED_DEFAULTS: &[(&str, &str, &str)] = &[
    ("events", "lease_expires_at", "0"),
    ("events", "published_at", "-1"),
];

/// The schema DDL for these table names.
pub fn schema_sql(tables: &TableNames) -> String {
    tables.render(SCHEMA)
}

/// The events table's secondary indexes in `schema` (a rendered
/// template), as (name, columns) in the form `information_schema` lists
/// them: `migrate()` brings older tables to these definitions. Read from
/// the template so the two cannot drift.
pub fn event_indexes(schema: &str) -> Vec<(String, String)> {
    let table = schema
        .split("CREATE TABLE IF NOT EXISTS ")
        .find(|t| {
            t.split_once(' ')
                .is_some_and(|(name, _)| name.ends_with("_events"))
        })
        .unwrap_or_default();
    table
        .lines()
        .filter_map(|line| line.trim().strip_prefix("KEY "))
        .filter_map(|key| {
            let (name, rest) = key.split_once(' ')?;
            let columns = rest.trim_start_matches('(').split_once(')')?.0;
            Some((name.to_owned(), columns.to_owned()))
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_indexes_are_read_from_the_rendered_template() {
        let names = TableNames::with_prefix("shop").unwrap();
        let indexes = event_indexes(&schema_sql(&names));
        let names: Vec<&str> = indexes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "shop_events_live",
                "shop_events_key",
                "shop_events_key_due",
                "shop_events_unfinished",
                "shop_events_published",
                "shop_events_superseded"
            ]
        );
        assert_eq!(indexes[1].1, "partition_key, blocks_key, sequence");
        assert_eq!(indexes[2].1, "partition_key, available_at");
    }

    /// A lease and an ack change a row's status: each index holding it
    /// moves an entry twice per event, so only the claim's live index
    /// does.
    #[test]
    fn only_the_live_index_holds_status() {
        let indexes = event_indexes(&schema_sql(&TableNames::default()));
        let with_status: Vec<&str> = indexes
            .iter()
            .filter(|(_, columns)| columns.split(", ").any(|c| c == "status"))
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(with_status, ["outbox_events_live"]);
    }
}
