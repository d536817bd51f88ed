//! The broker side of the outbox.

mod error;

use std::sync::Arc;

use async_trait::async_trait;

pub use error::{ErrorClass, PublishError, PublishOutcome};

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
}

#[async_trait]
impl<P: Publisher + ?Sized> Publisher for Arc<P> {
    fn capabilities(&self) -> PublisherCapabilities {
        (**self).capabilities()
    }
    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        (**self).publish(batch).await
    }
}

#[async_trait]
impl<P: Publisher + ?Sized> Publisher for Box<P> {
    fn capabilities(&self) -> PublisherCapabilities {
        (**self).capabilities()
    }
    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        (**self).publish(batch).await
    }
}
