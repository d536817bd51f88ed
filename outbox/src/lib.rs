#![doc = include_str!("../README.md")]
// docs.rs builds with `--cfg outbox_docsrs` (see Cargo.toml) on nightly,
// where each feature-gated item shows the feature it needs. Not `docsrs`:
// `RUSTDOCFLAGS="--cfg docsrs" cargo +stable doc` must build too.
#![cfg_attr(outbox_docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub use outbox_core::*;

/// Stores on `sqlx` (PostgreSQL, MySQL/MariaDB, SQLite).
#[cfg(any(
    feature = "sqlx-postgres",
    feature = "sqlx-mysql",
    feature = "sqlx-sqlite"
))]
#[cfg_attr(
    outbox_docsrs,
    doc(cfg(any(
        feature = "sqlx-postgres",
        feature = "sqlx-mysql",
        feature = "sqlx-sqlite"
    )))
)]
pub use outbox_sqlx as sqlx;

/// Redis Streams publisher, consumer runner and Redis inbox.
#[cfg(feature = "redis")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "redis")))]
pub use outbox_redis as redis;

/// Kafka publisher (rdkafka).
#[cfg(feature = "kafka")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "kafka")))]
pub use outbox_kafka as kafka;

/// Enqueue inside Diesel transactions, sync and async (PostgreSQL).
#[cfg(any(feature = "diesel-postgres", feature = "diesel-mysql"))]
#[cfg_attr(
    outbox_docsrs,
    doc(cfg(any(feature = "diesel-postgres", feature = "diesel-mysql")))
)]
pub use outbox_diesel as diesel;

/// Amazon SNS publisher (standard and FIFO topics) and SQS consumer runner.
#[cfg(feature = "sns")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "sns")))]
pub use outbox_sns as sns;
