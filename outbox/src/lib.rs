//! Transactional outbox and inbox for Rust.
//!
//! This facade re-exports [`outbox_core`]; adapters join behind features
//! (`sqlx-postgres`, `sqlx-mysql`, `sqlx-sqlite`, `kafka`, `sns`, `redis`)
//! as they land.
#![forbid(unsafe_code)]

pub use outbox_core::*;
