//! Validation of events at enqueue: clear errors, never silent truncation.

use super::NewEvent;

/// Why an event was refused at enqueue. The caller's transaction is still
/// open; the caller decides whether to roll back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidEvent {
    /// A required text field is empty.
    #[error("event field `{0}` must not be empty")]
    EmptyField(&'static str),
    /// A free header takes a name the broker envelope uses for the event's
    /// identity ([`super::wire::is_reserved`]).
    #[error("header `{0}` is reserved for the event's envelope on every broker; rename it")]
    ReservedHeader(String),
    /// The builder was given no id. The id is what makes a retried request
    /// enqueue nothing twice, so it is never made up silently.
    #[error(
        "the event has no id: call `.deterministic_id(namespace, discriminator)` so a retried \
         request enqueues the same event (a reported no-op), or `.event_id(EventId::random())` \
         for a fresh one"
    )]
    MissingId,
    /// A text field is longer than the store's column allows.
    #[error("event field `{field}` is {len} bytes, longer than the limit of {max}")]
    FieldTooLong {
        /// Field name.
        field: &'static str,
        /// Actual length in bytes.
        len: usize,
        /// Limit in bytes.
        max: usize,
    },
    /// The payload is larger than the configured limit.
    #[error("payload is {len} bytes, larger than the limit of {max}")]
    PayloadTooLarge {
        /// Actual size in bytes.
        len: usize,
        /// Limit in bytes.
        max: usize,
    },
    /// The headers are larger than the configured limit.
    #[error("headers are {len} bytes, larger than the limit of {max}")]
    HeadersTooLarge {
        /// Actual size in bytes.
        len: usize,
        /// Limit in bytes.
        max: usize,
    },
    /// The payload is not valid JSON or could not be serialized.
    #[error("payload is not valid JSON: {0}")]
    PayloadNotJson(String),
    /// The payload holds a character this store cannot keep (e.g. U+0000 in
    /// PostgreSQL `jsonb`).
    #[error("payload holds a character the store cannot keep: {0}")]
    UnstorableCharacter(&'static str),
}

/// Size limits checked at enqueue. Defaults fit every bundled store and the
/// usual broker limits (Kafka's default `message.max.bytes` is ~1 MiB, SNS 256 KiB).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventLimits {
    /// Largest payload accepted, in bytes. Default 256 KiB.
    pub max_payload_bytes: usize,
    /// Largest `event_type`, `aggregate_type`, `aggregate_id` and
    /// `partition_key`, in bytes. Default 255.
    pub max_identifier_bytes: usize,
    /// Largest total of header names and values, in bytes. Default 16 KiB.
    pub max_header_bytes: usize,
}

impl Default for EventLimits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 256 * 1024,
            max_identifier_bytes: 255,
            max_header_bytes: 16 * 1024,
        }
    }
}

impl EventLimits {
    /// Checks `event` against these limits.
    pub fn check(&self, event: &NewEvent) -> Result<(), InvalidEvent> {
        for (field, value) in [
            ("event_type", event.event_type.as_str()),
            ("aggregate_type", event.aggregate_type.as_str()),
            ("aggregate_id", event.aggregate_id.as_str()),
            ("partition_key", event.partition_key.as_str()),
        ] {
            if value.trim().is_empty() {
                return Err(InvalidEvent::EmptyField(field));
            }
            if value.len() > self.max_identifier_bytes {
                return Err(InvalidEvent::FieldTooLong {
                    field,
                    len: value.len(),
                    max: self.max_identifier_bytes,
                });
            }
        }
        if event.payload.len() > self.max_payload_bytes {
            return Err(InvalidEvent::PayloadTooLarge {
                len: event.payload.len(),
                max: self.max_payload_bytes,
            });
        }
        if let Some(name) = event
            .headers
            .extra
            .keys()
            .find(|name| super::wire::is_reserved(name))
        {
            return Err(InvalidEvent::ReservedHeader(name.clone()));
        }
        let header_len = event.headers.encoded_len();
        if header_len > self.max_header_bytes {
            return Err(InvalidEvent::HeadersTooLarge {
                len: header_len,
                max: self.max_header_bytes,
            });
        }
        Ok(())
    }
}
