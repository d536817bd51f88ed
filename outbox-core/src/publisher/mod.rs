//! The broker side of the outbox.

mod error;
mod routes;

use std::sync::Arc;

use async_trait::async_trait;

pub use error::{ErrorClass, PublishError, PublishOutcome};
pub use routes::PrefixRoutes;

use crate::event::StoredEvent;

/// What a publisher can do; the relay shapes its batches by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublisherCapabilities {
    /// Most events per [`Publisher::publish`] call.
    pub max_batch: usize,
    /// Whether, within one call, events of one key are delivered in the order
    /// given and an event that fails stops every later event of its key in
    /// that call from being delivered. When true the relay hands over a whole
    /// batch at once; otherwise it sends a key's events in successive calls.
    /// The events held back after a key's failure may carry any error: the
    /// relay returns them to the store untouched, burning no attempt.
    pub preserves_key_order: bool,
}

impl Default for PublisherCapabilities {
    fn default() -> Self {
        Self {
            max_batch: 256,
            preserves_key_order: false,
        }
    }
}

/// Sends events to a broker.
///
/// Return one outcome per event, in order, and only once each event's fate
/// is known; classify failures so the relay does the right thing:
/// [`PublishError::transient`] (retry with backoff),
/// [`PublishError::permanent`] (this event fails alone),
/// [`PublishError::outage`] (the broker is down: pause, burn no attempts).
///
/// ```
/// use outbox_core::{PublishError, PublishOutcome, Publisher, PublisherCapabilities, StoredEvent};
///
/// /// Posts each event to a webhook (the HTTP call is left out).
/// struct Webhook;
///
/// #[async_trait::async_trait]
/// impl Publisher for Webhook {
///     fn capabilities(&self) -> PublisherCapabilities {
///         // One request per event, in the order given: a key's order holds
///         // within a call, so the relay may hand over whole batches.
///         PublisherCapabilities { max_batch: 64, preserves_key_order: true }
///     }
///
///     async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
///         let mut outcomes = Vec::with_capacity(batch.len());
///         let mut failed_keys = std::collections::HashSet::new();
///         for stored in batch {
///             let key = &stored.event.partition_key;
///             if failed_keys.contains(key) {
///                 // preserves_key_order: nothing after a key's failure.
///                 outcomes.push(Err(PublishError::transient("an earlier event of the key failed")));
///                 continue;
///             }
///             let status = 200; // post(stored.event.payload.as_str()).await
///             let outcome = match status {
///                 200..=299 => Ok(()),
///                 400 | 422 => Err(PublishError::permanent(format!("rejected: {status}"))),
///                 503 => Err(PublishError::outage("webhook unavailable")),
///                 _ => Err(PublishError::transient(format!("status {status}"))),
///             };
///             if outcome.is_err() {
///                 failed_keys.insert(key.clone());
///             }
///             outcomes.push(outcome);
///         }
///         outcomes
///     }
/// }
/// ```
#[async_trait]
pub trait Publisher: Send + Sync {
    /// What this publisher can do.
    fn capabilities(&self) -> PublisherCapabilities {
        PublisherCapabilities::default()
    }

    /// Publishes `batch`, returning one classified outcome per event, in the
    /// same order. A publisher must not return before every event's fate is
    /// known; the relay bounds the call with its publish timeout.
    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome>;

    /// Where events go, for operators: named in a paused relay's outage
    /// record (`status`, `health`), its logs and the
    /// `outbox_publisher_outage` gauge. Never include credentials. The
    /// default is the publisher's type name.
    fn destination(&self) -> String {
        std::any::type_name::<Self>().to_owned()
    }
}

/// A publisher behind a shared or boxed pointer is a publisher.
macro_rules! pointer_publisher {
    ($($pointer:ident),*) => {$(
        #[async_trait]
        impl<P: Publisher + ?Sized> Publisher for $pointer<P> {
            fn capabilities(&self) -> PublisherCapabilities {
                (**self).capabilities()
            }
            async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
                (**self).publish(batch).await
            }
            fn destination(&self) -> String {
                (**self).destination()
            }
        }
    )*};
}

pointer_publisher!(Arc, Box);
