//! Transactional outbox and inbox for Rust.
//!
//! Re-exports [`outbox_core`] (the event model, traits and relay) and, behind
//! features, the adapters:
//!
//! | feature | module |
//! |---|---|
//! | `sqlx-postgres`, `sqlx-mysql`, `sqlx-sqlite` | [`sqlx`] (`outbox-sqlx`) |
//! | `redis` | [`redis`] (`outbox-redis`) |
//! | `kafka` | [`kafka`] (`outbox-kafka`) |
//! | `sns` | [`sns`] (`outbox-sns`): SNS publisher, SQS consumer runner |
//! | `testing` | conformance suites for custom backends |
#![forbid(unsafe_code)]

pub use outbox_core::*;

/// Stores on `sqlx` (PostgreSQL, MySQL/MariaDB, SQLite).
#[cfg(any(
    feature = "sqlx-postgres",
    feature = "sqlx-mysql",
    feature = "sqlx-sqlite"
))]
pub use outbox_sqlx as sqlx;

/// Redis Streams publisher, consumer runner and Redis inbox.
#[cfg(feature = "redis")]
pub use outbox_redis as redis;

/// Kafka publisher (rdkafka).
#[cfg(feature = "kafka")]
pub use outbox_kafka as kafka;

/// Amazon SNS publisher (standard and FIFO topics) and SQS consumer runner.
#[cfg(feature = "sns")]
pub use outbox_sns as sns;
