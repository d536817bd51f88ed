//! Typed events: a Rust type that knows its event type, aggregate and key.

use serde::Serialize;
use uuid::Uuid;

use super::{EventId, InvalidEvent, NewEvent};

/// A domain event type serialized with `serde`.
///
/// ```
/// use outbox_core::{NewEvent, TypedEvent};
/// #[derive(serde::Serialize)]
/// struct InvoicePaid { invoice_id: String, payment_id: String, subscription_id: String }
///
/// impl TypedEvent for InvoicePaid {
///     const EVENT_TYPE: &'static str = "invoice.paid";
///     const AGGREGATE_TYPE: &'static str = "invoice";
///     fn aggregate_id(&self) -> String { self.invoice_id.clone() }
///     fn discriminator(&self) -> String { self.payment_id.clone() }
///     fn partition_key(&self) -> Option<String> { Some(self.subscription_id.clone()) }
/// }
///
/// let ns = uuid::Uuid::from_u128(1);
/// let paid = InvoicePaid { invoice_id: "inv-1".into(), payment_id: "pay-9".into(), subscription_id: "sub-3".into() };
/// let event = NewEvent::from_typed(&paid, ns).unwrap();
/// assert_eq!(event.partition_key, "sub-3");
/// assert_eq!(event.event_id, NewEvent::from_typed(&paid, ns).unwrap().event_id);
/// ```
pub trait TypedEvent: Serialize {
    /// The routed event type, e.g. `invoice.paid`.
    const EVENT_TYPE: &'static str;
    /// The aggregate kind, e.g. `invoice`.
    const AGGREGATE_TYPE: &'static str;
    /// Payload schema version.
    const PAYLOAD_VERSION: u32 = 1;

    /// The aggregate's id.
    fn aggregate_id(&self) -> String;

    /// What makes this occurrence unique within its aggregate and event type
    /// (a payment id, a billing period). Replaying the same business
    /// operation must yield the same discriminator.
    fn discriminator(&self) -> String;

    /// Ordering key; `None` means the aggregate id.
    fn partition_key(&self) -> Option<String> {
        None
    }

    /// The deterministic id: [`EventId::deterministic`] over the aggregate id
    /// and `"{EVENT_TYPE}/{discriminator}"`.
    fn event_id(&self, namespace: Uuid) -> EventId {
        let discriminator = format!("{}/{}", Self::EVENT_TYPE, self.discriminator());
        EventId::deterministic(namespace, &self.aggregate_id(), &discriminator)
    }
}

impl NewEvent {
    /// Builds the event for a typed domain event, with its deterministic id.
    pub fn from_typed<T: TypedEvent>(event: &T, namespace: Uuid) -> Result<Self, InvalidEvent> {
        let mut builder = NewEvent::builder(T::EVENT_TYPE, T::AGGREGATE_TYPE, event.aggregate_id())
            .event_id(event.event_id(namespace))
            .payload(event)
            .payload_version(T::PAYLOAD_VERSION);
        if let Some(key) = event.partition_key() {
            builder = builder.partition_key(key);
        }
        builder.build()
    }
}
