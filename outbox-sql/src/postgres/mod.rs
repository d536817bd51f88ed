//! PostgreSQL: the schema template (tables, indexes, trigger and the
//! functions that run the protocol), its version, and every statement.

mod queries;

pub use queries::{EVENT_COLUMNS, Queries};

use crate::config::StoreConfig;

/// The schema template, written with the default names and placeholders
/// ([`schema_sql`] renders it).
pub const SCHEMA: &str = include_str!("schema.sql");

/// The schema version the template creates.
pub const SCHEMA_VERSION: i32 = 2;

/// The schema DDL and functions for `config`'s table names and limits.
pub fn schema_sql(config: &StoreConfig, queries: &Queries) -> String {
    let limits = &config.limits;
    config
        .tables
        .render(SCHEMA)
        .replace("{{channel}}", &queries.channel)
        .replace("{{claim_lock}}", &queries.claim_lock.to_string())
        .replace("{{producer_lock}}", &queries.producer_lock.to_string())
        // pg_locks shows a bigint advisory key as two oids.
        .replace(
            "{{producer_lock_classid}}",
            &((queries.producer_lock as u64) >> 32).to_string(),
        )
        .replace(
            "{{producer_lock_objid}}",
            &((queries.producer_lock as u64) & 0xffff_ffff).to_string(),
        )
        .replace("{{schema_version}}", &SCHEMA_VERSION.to_string())
        .replace(
            "{{max_identifier_bytes}}",
            &limits.max_identifier_bytes.to_string(),
        )
        .replace(
            "{{max_payload_bytes}}",
            &limits.max_payload_bytes.to_string(),
        )
        .replace("{{max_header_bytes}}", &limits.max_header_bytes.to_string())
}
