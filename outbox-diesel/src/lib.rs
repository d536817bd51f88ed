#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod effect;
mod error;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use effect::Effect;
pub use error::Error;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;

/// The Diesel these functions were built against (its connections and
/// transactions are what you pass in).
pub use diesel;
/// The diesel-async these functions were built against.
pub use diesel_async;
pub use outbox_sql::{Migrated, StoreConfig, TableNames};
