#![doc = include_str!("../README.md")]
// docs.rs builds with `--cfg outbox_docsrs` (see Cargo.toml) on nightly,
// where each feature-gated item shows the feature it needs. Not `docsrs`:
// `RUSTDOCFLAGS="--cfg docsrs" cargo +stable doc` must build too.
#![cfg_attr(outbox_docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod driver;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod effect;
mod error;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod inbox;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[macro_use]
mod outbox;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(outbox_docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use effect::Effect;
pub use error::Error;
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(outbox_docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
pub use inbox::{DieselInbox, DieselInboxTx, InboxDialect};
#[cfg(feature = "mysql")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;

/// The Diesel these functions were built against (its connections and
/// transactions are what you pass in).
pub use diesel;
/// The diesel-async these functions were built against.
pub use diesel_async;
pub use outbox_sql::{Migrated, StoreConfig, TableNames};
