#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod codes;
mod config;
mod error;
mod validate;

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use config::{DEFAULT_PREFIX, StoreConfig, TableNames};
