#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod admin_common;
#[cfg(any(feature = "mysql", feature = "sqlite"))]
mod blame;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod codes;
mod config;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod error;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod history;
mod pool;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod validate;

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
