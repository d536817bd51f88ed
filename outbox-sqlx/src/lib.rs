#![doc = include_str!("../README.md")]
// docs.rs builds with `--cfg outbox_docsrs` (see Cargo.toml) on nightly,
// where each feature-gated item shows the feature it needs. Not `docsrs`:
// `RUSTDOCFLAGS="--cfg docsrs" cargo +stable doc` must build too.
#![cfg_attr(outbox_docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

// What the SQL adapters share (schema, statements, codes, validation) is
// `outbox-sql`'s; this alias keeps the `crate::config` paths the stores use.
use outbox_sql::config;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod error;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod inbox;
mod pool;
mod redact;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
mod scalars;
pub mod tenants;

#[cfg(feature = "mysql")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
#[cfg(feature = "sqlite")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

pub use config::{DEFAULT_PREFIX, Migrated, StoreConfig, TableNames};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use inbox::{InboxDialect, SqlxInbox};
pub use pool::guard_cancelled_transactions;
pub use redact::without_password;
/// The `sqlx` these stores were built against: build pools and open
/// transactions with it, and one dependency line is enough.
pub use sqlx;
