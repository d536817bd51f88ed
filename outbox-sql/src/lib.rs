#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

/// Explains why an operator action found no event to act on.
pub mod admin_common;
/// The statements `OutboxAdmin` runs, and those dialects write alike.
pub mod admin_queries;
/// `OutboxAdmin` on each dialect's protocol, written once.
mod admin_traits;
/// Crash blame for the stores that mark leases on rows (MySQL, SQLite).
pub mod blame;
/// A claim's choice in Rust (MySQL, SQLite).
mod choose;
/// Codes stored in the tables: event status, attempt kinds, error classes.
pub mod codes;
/// Table names, store settings, schema versions.
pub mod config;
/// `delegate_sql_store!`: the core's store traits on an adapter's store type.
mod delegate;
/// An enqueue as column arrays, and its outcomes.
pub mod enqueue;
/// `dialect_protocol!`: the `Protocol<D>` of MySQL and SQLite.
#[macro_use]
mod dialect_protocol;
/// Naming the operation and table in a store error.
pub mod error;
/// Attempt-history rows as the stores append them in batches.
pub mod history;
/// The core's fault seams once per dialect (feature `testing`); first, so
/// the dialects' modules see its macro.
#[cfg(feature = "testing")]
#[macro_use]
pub mod testing;
/// MySQL/MariaDB schema and statements.
pub mod mysql;
/// A scalar statement parameter (MySQL, SQLite), and the `From`
/// conversions every dialect's parameter enum declares alike.
pub mod param;
/// PostgreSQL schema and statements.
pub mod postgres;
/// The core's store traits on each dialect's protocol.
mod protocol_traits;
/// A result row as drivers hand it to their dialect's protocol.
pub mod row;
/// A claim's and a settlement's rows, and a nack's parameters, for any driver.
pub mod settle;
/// SQLite schema and statements.
pub mod sqlite;
/// The checks every enqueue runs before a row is written.
pub mod validate;

pub use config::{DEFAULT_PREFIX, Migrated, StoreConfig, TableNames};

/// What [`delegate_sql_store!`] names; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use async_trait::async_trait;
    #[cfg(feature = "testing")]
    pub use outbox_core::testing;
    pub use outbox_core::{Clock, EventId, NewEvent, StoreError, store};
    #[cfg(feature = "testing")]
    pub use tokio::sync::oneshot;
}
