#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

// What the SQL adapters share (schema, statements, codes, validation) is
// `outbox-sql`'s; these aliases keep the `crate::…` paths the stores use.
use outbox_sql::config;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use outbox_sql::{admin_common, codes, validate};
#[cfg(feature = "sqlite")]
use outbox_sql::{blame, history};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod error;
mod pool;

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use config::{DEFAULT_PREFIX, Migrated, StoreConfig, TableNames};
pub use pool::guard_cancelled_transactions;
/// The `sqlx` these stores were built against: build pools and open
/// transactions with it, and one dependency line is enough.
pub use sqlx;
