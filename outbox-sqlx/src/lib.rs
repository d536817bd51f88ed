#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod codes;
mod config;
mod error;
mod history;
mod pool;
mod validate;

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use config::{DEFAULT_PREFIX, StoreConfig, TableNames};
pub use pool::guard_cancelled_transactions;
