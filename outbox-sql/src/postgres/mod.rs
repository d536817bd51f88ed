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

#[cfg(test)]
mod tests {
    /// `outbox_enqueue` refuses the header names the Rust enqueue refuses:
    /// the template lists every reserved name, and no other.
    #[test]
    fn sql_enqueue_reserves_the_envelopes_names() {
        let clause = super::SCHEMA
            .split("WHERE k IN (")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .expect("the reserved-header clause");
        let mut listed: Vec<&str> = clause
            .split(',')
            .map(|n| n.trim().trim_matches('\''))
            .collect();
        listed.sort_unstable();
        let mut reserved: Vec<&str> = outbox_core::event::wire::IDENTITY.to_vec();
        reserved.extend([
            outbox_core::event::wire::names::PAYLOAD,
            outbox_core::event::wire::names::PACKED_HEADERS,
        ]);
        reserved.sort_unstable();
        assert_eq!(listed, reserved);
        assert!(
            reserved
                .iter()
                .all(|n| outbox_core::event::wire::is_reserved(n))
        );
    }
}
