#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod error;
pub use error::Error;
#[cfg(feature = "postgres")]
pub mod postgres;

/// The Diesel these functions were built against (its connections and
/// transactions are what you pass in).
pub use diesel;
/// The diesel-async these functions were built against.
pub use diesel_async;
pub use outbox_sql::{Migrated, StoreConfig, TableNames};
