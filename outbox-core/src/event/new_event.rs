//! The event as written by the business transaction, and its builder.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{EventId, Headers, InvalidEvent, Payload};

/// An event about to be enqueued in the caller's transaction.
///
/// Built with [`NewEvent::builder`] or [`NewEvent::from_typed`]; the fields
/// follow the event model's rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NewEvent {
    /// Stable id of the logical event; enqueueing it twice is a no-op.
    pub event_id: EventId,
    /// Business entity kind, e.g. `invoice`.
    pub aggregate_type: String,
    /// Business entity id, e.g. `8a3f…`.
    pub aggregate_id: String,
    /// What happened, e.g. `invoice.paid`; routes to a topic or stream.
    pub event_type: String,
    /// Ordering key: events of one key are published in enqueue order.
    pub partition_key: String,
    /// Facts true at commit time.
    pub payload: Payload,
    /// Schema version of the payload.
    pub payload_version: u32,
    /// Correlation, causation, trace context and free key/values.
    pub headers: Headers,
    /// Earliest publish time; `None` means as soon as committed.
    pub available_at: Option<DateTime<Utc>>,
}

impl NewEvent {
    /// Starts a builder. The partition key defaults to `aggregate_id`.
    pub fn builder(
        event_type: impl Into<String>,
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
    ) -> NewEventBuilder {
        NewEventBuilder {
            event_id: None,
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            partition_key: None,
            payload: None,
            payload_version: 1,
            headers: Headers::default(),
            available_at: None,
        }
    }
}

/// Builds a [`NewEvent`]; see [`NewEvent::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct NewEventBuilder {
    event_id: Option<EventId>,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    partition_key: Option<String>,
    payload: Option<Result<Payload, InvalidEvent>>,
    payload_version: u32,
    headers: Headers,
    available_at: Option<DateTime<Utc>>,
}

impl NewEventBuilder {
    /// Uses an explicit id.
    pub fn event_id(mut self, id: EventId) -> Self {
        self.event_id = Some(id);
        self
    }

    /// Derives the id with [`EventId::deterministic`] from this event's
    /// aggregate id and `discriminator` (e.g. the payment id).
    pub fn deterministic_id(mut self, namespace: Uuid, discriminator: &str) -> Self {
        self.event_id = Some(EventId::deterministic(
            namespace,
            &self.aggregate_id,
            discriminator,
        ));
        self
    }

    /// Overrides the ordering key (default: the aggregate id).
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.partition_key = Some(key.into());
        self
    }

    /// Serializes `value` as the payload.
    pub fn payload<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        self.payload = Some(Payload::from_serialize(value));
        self
    }

    /// Uses JSON text as the payload (checked to parse).
    pub fn payload_json(mut self, text: impl Into<String>) -> Self {
        self.payload = Some(Payload::from_json_text(text));
        self
    }

    /// Sets the payload schema version (default 1).
    pub fn payload_version(mut self, version: u32) -> Self {
        self.payload_version = version;
        self
    }

    /// Replaces all headers.
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    /// Sets the correlation id.
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.headers.correlation_id = Some(id.into());
        self
    }

    /// Sets the causation id.
    pub fn causation_id(mut self, id: impl Into<String>) -> Self {
        self.headers.causation_id = Some(id.into());
        self
    }

    /// Sets the W3C `traceparent`.
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.headers.traceparent = Some(traceparent.into());
        self
    }

    /// Adds a free header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.extra.insert(name.into(), value.into());
        self
    }

    /// Delays publication until `at`.
    pub fn available_at(mut self, at: DateTime<Utc>) -> Self {
        self.available_at = Some(at);
        self
    }

    /// Finishes the event. Fails on a missing id ([`InvalidEvent::MissingId`]
    /// names the two ways to give one) or payload, an empty
    /// type/key, or a payload that is not JSON. Size limits are the store's
    /// to check at enqueue ([`super::EventLimits`]).
    ///
    /// With the `otel` feature, an event without a `traceparent` takes the
    /// current span's trace context here (see [`crate::trace`]).
    #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
    pub fn build(mut self) -> Result<NewEvent, InvalidEvent> {
        #[cfg(feature = "otel")]
        crate::trace::capture_into(&mut self.headers);
        let event_id = self.event_id.ok_or(InvalidEvent::MissingId)?;
        let payload = self.payload.ok_or(InvalidEvent::EmptyField("payload"))??;
        let partition_key = self
            .partition_key
            .unwrap_or_else(|| self.aggregate_id.clone());
        let event = NewEvent {
            event_id,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            event_type: self.event_type,
            partition_key,
            payload,
            payload_version: self.payload_version,
            headers: self.headers,
            available_at: self.available_at,
        };
        for (field, value) in [
            ("event_type", &event.event_type),
            ("aggregate_type", &event.aggregate_type),
            ("aggregate_id", &event.aggregate_id),
            ("partition_key", &event.partition_key),
        ] {
            if value.trim().is_empty() {
                return Err(InvalidEvent::EmptyField(field));
            }
        }
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_key_defaults_to_aggregate_id() {
        let e = NewEvent::builder("invoice.paid", "invoice", "inv-1")
            .event_id(EventId::random())
            .payload(&serde_json::json!({"amount": 10}))
            .build()
            .unwrap();
        assert_eq!(e.partition_key, "inv-1");
    }

    #[test]
    fn missing_or_empty_parts_are_named() {
        let base = || NewEvent::builder("invoice.paid", "invoice", "inv-1");
        assert_eq!(
            base().payload(&1).build().unwrap_err(),
            InvalidEvent::MissingId
        );
        let message = base().payload(&1).build().unwrap_err().to_string();
        assert!(
            message.contains(".deterministic_id(")
                && message.contains(".event_id(EventId::random())"),
            "says which method to call: {message}"
        );
        assert_eq!(
            base().event_id(EventId::random()).build().unwrap_err(),
            InvalidEvent::EmptyField("payload")
        );
        let err = NewEvent::builder(" ", "invoice", "inv-1")
            .event_id(EventId::random())
            .payload(&1)
            .build()
            .unwrap_err();
        assert_eq!(err, InvalidEvent::EmptyField("event_type"));
        let err = base()
            .event_id(EventId::random())
            .payload(&1)
            .partition_key("")
            .build()
            .unwrap_err();
        assert_eq!(err, InvalidEvent::EmptyField("partition_key"));
    }
}
