//! PostgreSQL: the schema template (tables, indexes, trigger and the
//! functions that run the protocol), its version, and every statement.

pub(crate) mod admin;
pub mod driver;
mod protocol;
mod queries;
mod statements;
#[cfg(feature = "testing")]
mod testing;

pub use driver::{Driver, Exec, Param, Row, Value};
pub use protocol::{Probe, Protocol, WakeState};
pub use queries::{EVENT_COLUMNS, Queries};
pub use statements::{Statements, claim_row, raw_event};

use crate::config::StoreConfig;

/// The schema template, written with the default names and placeholders
/// ([`schema_sql`] renders it): the files of `schema/`, one concept each,
/// in their names' order (`scripts/render-migrations.py` joins them the
/// same way).
pub const SCHEMA: &str = concat!(
    include_str!("schema/01_tables.sql"),
    include_str!("schema/02_enqueue_and_tick.sql"),
    include_str!("schema/03_recovery.sql"),
    include_str!("schema/04_pick.sql"),
    include_str!("schema/05_pick_plain.sql"),
    include_str!("schema/06_claim.sql"),
    include_str!("schema/07_settle.sql"),
    include_str!("schema/08_admin.sql"),
);

/// The schema version the template creates.
pub const SCHEMA_VERSION: i32 = 2;

/// The schema DDL and functions for `config`'s table names and limits.
/// Its last statements record [`schema_fingerprint`] in
/// `outbox_schema_applied`.
pub fn schema_sql(config: &StoreConfig, queries: &Queries) -> String {
    let rendered = render(config, queries);
    let fingerprint = fingerprint_of(&rendered);
    rendered.replace("{{fingerprint}}", &fingerprint)
}

/// A fingerprint of the schema [`schema_sql`] applies: `migrate()` on
/// tables that recorded the same one has nothing to do, and does nothing
/// (no DDL, so no lock a producer could queue behind).
pub fn schema_fingerprint(config: &StoreConfig, queries: &Queries) -> String {
    fingerprint_of(&render(config, queries))
}

/// FNV-1a (64 bits) of the text, as 16 hex digits (scripts/render-migrations.py
/// computes the same for the shipped migration).
fn fingerprint_of(rendered: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in rendered.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// How long `migrate()` waits for one of its locks when it has DDL to run
/// (an upgrade); past it the attempt is rolled back and retried, so
/// producers never queue behind a migration stuck behind a long reader.
pub const MIGRATE_LOCK_TIMEOUT_MS: u64 = 1_000;

/// Attempts `migrate()` makes before it reports that it could not take its
/// locks.
pub const MIGRATE_ATTEMPTS: u32 = 5;

/// The SQLSTATE of a lock not taken within `lock_timeout`.
pub const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The statement that bounds each lock wait of `migrate()`'s DDL.
pub fn migrate_lock_timeout() -> String {
    format!("SET LOCAL lock_timeout = {MIGRATE_LOCK_TIMEOUT_MS}")
}

/// The pause before `migrate()`'s attempt `attempt + 1`.
pub fn migrate_pause(attempt: u32) -> std::time::Duration {
    std::time::Duration::from_millis(MIGRATE_LOCK_TIMEOUT_MS * u64::from(attempt))
}

/// What `migrate()` says when every attempt found its locks taken
/// (retryable: the transaction holding them will end).
pub fn migrate_locks_unavailable() -> outbox_core::StoreError {
    outbox_core::StoreError::Unavailable(
        format!(
            "migrate() could not take the locks its DDL needs in {MIGRATE_ATTEMPTS} attempts of \
             {MIGRATE_LOCK_TIMEOUT_MS} ms: a transaction holds the outbox tables (see pg_locks); \
             retry when it has ended"
        )
        .into(),
    )
}

fn render(config: &StoreConfig, queries: &Queries) -> String {
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
