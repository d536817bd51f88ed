#![doc = include_str!("../README.md")]
// docs.rs builds with `--cfg outbox_docsrs` (see Cargo.toml) on nightly,
// where each feature-gated item shows the feature it needs. Not `docsrs`:
// `RUSTDOCFLAGS="--cfg docsrs" cargo +stable doc` must build too.
#![cfg_attr(outbox_docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub mod clock;
pub mod consume;
pub mod dead_letter;
mod error;
pub mod event;
mod inbox;
pub mod memory;
pub mod policy;
pub mod publisher;
pub mod relay;
pub mod store;
pub mod tenants;
#[cfg(feature = "testing")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
pub mod trace;

pub use clock::{Clock, ManualClock, SkewedClock, StoreTime, SystemClock};
pub use error::{BoxError, DuringOperation, StoreError};
pub use event::{
    EventId, EventLimits, Headers, InvalidEvent, NewEvent, Payload, RawEvent, StoredEvent,
    TypedEvent, UnreadableEvent,
};
pub use inbox::InboxStore;
pub use policy::{Ordering, PoisonPolicy, RetryPolicy};
pub use publisher::{ErrorClass, PublishError, PublishOutcome, Publisher, PublisherCapabilities};
pub use relay::{Relay, RelayConfig, RelayError, RelayReport, WakeUp};
pub use store::{OutboxAdmin, OutboxStore, OutboxWriter, RelayId};
/// Re-exported so callers need not depend on `tokio-util` to stop a relay.
pub use tokio_util::sync::CancellationToken;

/// The attribute implementations of [`Publisher`], [`OutboxStore`] and the
/// other async traits use (the version this crate was built against).
pub use async_trait::async_trait;
/// The date-time crate of the public API (`DateTime<Utc>` in events,
/// history and admin answers).
pub use chrono;
/// The OpenTelemetry API this crate links its spans with (feature `otel`):
/// install your tracer provider from this version, or the spans' contexts
/// do not reach it.
#[cfg(feature = "otel")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "otel")))]
pub use opentelemetry;
/// The JSON crate of the public API (payloads are JSON: `NewEvent`'s
/// `payload` takes any `Serialize`, `serde_json::json!` included).
pub use serde_json;
/// The `tracing` → OpenTelemetry bridge this crate reads and writes span
/// contexts through (feature `otel`): build your layer from this version.
#[cfg(feature = "otel")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "otel")))]
pub use tracing_opentelemetry;
/// The UUID crate of the public API ([`EventId`] wraps a `uuid::Uuid`;
/// `EventId::deterministic` takes a namespace `Uuid`).
pub use uuid;
