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
//! | `diesel-postgres`, `diesel-mysql` | [`diesel`] (`outbox-diesel`): enqueue inside your Diesel transaction (`PgConnection`/`MysqlConnection`, diesel-async's `AsyncPgConnection`/`AsyncMysqlConnection`), the store and inbox on diesel-async |
//! | `otel` | OpenTelemetry across the hop ([`trace`]): enqueue captures the current span's context into `traceparent`, the relay's publish span links to it, consumer handler spans are its children |
//! | `testing` | conformance suites for custom backends |
//!
//! One dependency line is enough: the crates the public API is built on
//! come with it — [`async_trait`](macro@async_trait) and [`chrono`] here,
//! `outbox::sqlx::sqlx`, `outbox::redis::redis`, `outbox::kafka::rdkafka`
//! and `outbox::sns::{aws_sdk_sns, aws_sdk_sqs, aws_types}` in the adapter
//! modules — so your code and the adapters agree on their versions.
//!
//! ```toml
//! [dependencies]
//! outbox = { version = "0.1", features = ["sqlx-sqlite"] }
//! tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
//! ```
//!
//! # A publisher of your own
//!
//! Any broker is a [`Publisher`]: one classified outcome per event, in
//! order. This one prints; the relay drains an in-memory store through it.
//!
//! ```
//! use std::sync::Arc;
//! use outbox::{
//!     CancellationToken, NewEvent, OutboxWriter, PublishError, PublishOutcome, Publisher, Relay,
//!     RelayConfig, StoredEvent,
//! };
//!
//! struct Stdout;
//!
//! #[outbox::async_trait]
//! impl Publisher for Stdout {
//!     async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
//!         batch
//!             .iter()
//!             .map(|stored| {
//!                 let event = &stored.event;
//!                 if event.payload.is_empty() {
//!                     // Permanent: retrying cannot help; the event fails alone.
//!                     return Err(PublishError::permanent("empty payload"));
//!                 }
//!                 println!("{} {} {}", event.event_type, event.partition_key, event.payload.as_str());
//!                 Ok(())
//!             })
//!             .collect()
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(outbox::memory::MemoryStore::new());
//! let paid = NewEvent::builder("invoice.paid", "invoice", "inv-1")
//!     .event_id(outbox::EventId::random())
//!     .payload_json(r#"{"amount_cents":1200}"#)
//!     .build()?;
//! store.enqueue(&[paid]).await?;
//!
//! let shutdown = CancellationToken::new();
//! let relay = Relay::new(store.clone(), Arc::new(Stdout), RelayConfig::default())?
//!     .spawn(shutdown.clone());
//! while outbox::OutboxAdmin::stats(&*store).await?.iter().any(|s| s.claimable + s.in_flight > 0) {
//!     tokio::time::sleep(std::time::Duration::from_millis(10)).await;
//! }
//! shutdown.cancel();
//! let report = relay.await??;
//! assert_eq!(report.published, 1);
//! # Ok(())
//! # }
//! ```
//!
//! # The event in your own transaction (feature `sqlx-sqlite`)
//!
//! The business write and the event commit together or not at all; the
//! same shape holds for `PgStore` and `MySqlStore`.
//!
//! ```no_run
//! # #[cfg(feature = "sqlx-sqlite")]
//! # async fn pay() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox::sqlx::sqlite::SqliteStore;
//! use outbox::sqlx::{StoreConfig, sqlx};
//!
//! let store = SqliteStore::open("app.db", StoreConfig::default()).await?;
//! store.migrate().await?;
//! let mut tx = store.begin_immediate().await?;
//! sqlx::query("UPDATE invoices SET status = 'paid' WHERE id = ?")
//!     .bind("inv-1")
//!     .execute(&mut *tx)
//!     .await?;
//! let paid = outbox::NewEvent::builder("invoice.paid", "invoice", "inv-1")
//!     .event_id(outbox::EventId::random())
//!     .payload_json(r#"{"amount_cents":1200}"#)
//!     .build()?;
//! store.enqueue(&mut *tx, &[paid]).await?;
//! tx.commit().await?;
//! # Ok(())
//! # }
//! ```
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

/// Enqueue inside Diesel transactions, sync and async (PostgreSQL).
#[cfg(any(feature = "diesel-postgres", feature = "diesel-mysql"))]
pub use outbox_diesel as diesel;

/// Amazon SNS publisher (standard and FIFO topics) and SQS consumer runner.
#[cfg(feature = "sns")]
pub use outbox_sns as sns;
