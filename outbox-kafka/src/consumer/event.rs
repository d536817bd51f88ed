//! The event a [`KafkaConsumer`](super::KafkaConsumer) hands its handler,
//! read from a message's payload and headers.

use outbox_core::chrono::{DateTime, Utc};
use outbox_core::event::wire;
use outbox_core::{EventId, Headers};
use rdkafka::message::{BorrowedMessage, Headers as _, Message};

use crate::headers::names;

/// An event as the consumer hands it to the handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaEvent {
    /// Topic, partition and offset it was read at.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
    /// From the `event_id` header.
    pub event_id: EventId,
    /// From the `event_type` header.
    pub event_type: String,
    /// The message key.
    pub partition_key: String,
    /// From the `aggregate_type` header (empty if absent).
    pub aggregate_type: String,
    /// From the `aggregate_id` header (empty if absent).
    pub aggregate_id: String,
    /// From the `payload_version` header (1 if absent).
    pub payload_version: u32,
    /// From the `occurred_at` header: when the event was enqueued (store
    /// time); `None` for messages written before the header existed.
    pub occurred_at: Option<DateTime<Utc>>,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// Correlation, causation, trace context and free headers.
    pub headers: Headers,
}

outbox_core::consumed_from_fields!(KafkaEvent);

impl KafkaEvent {
    pub(super) fn decode(message: &BorrowedMessage<'_>) -> Result<Self, String> {
        let mut pairs = Vec::new();
        if let Some(headers) = message.headers() {
            for header in headers.iter() {
                let value = String::from_utf8(header.value.unwrap_or_default().to_vec())
                    .map_err(|e| format!("header {}: {e}", header.key))?;
                pairs.push((header.key.to_owned(), value));
            }
        }
        let envelope = wire::read_envelope(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        let event_id = envelope
            .identity
            .get(names::EVENT_ID)
            .ok_or("no event_id header")?
            .parse()
            .map_err(|e| format!("event_id: {e}"))?;
        let event_type = envelope
            .identity
            .get(names::EVENT_TYPE)
            .ok_or("no event_type header")?
            .clone();
        let payload_version = match envelope.identity.get(names::PAYLOAD_VERSION) {
            None => 1,
            Some(v) => v
                .parse()
                .map_err(|e| format!("payload_version {v:?}: {e}"))?,
        };
        let occurred_at = envelope.occurred_at()?;
        Ok(Self {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            event_id,
            event_type,
            // The key is the partition key; the header repeats it for
            // consumers that read headers only.
            partition_key: message
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .unwrap_or_default(),
            aggregate_type: envelope.get(names::AGGREGATE_TYPE).to_owned(),
            aggregate_id: envelope.get(names::AGGREGATE_ID).to_owned(),
            payload_version,
            occurred_at,
            payload: message.payload().unwrap_or_default().to_vec(),
            headers: envelope.headers,
        })
    }
}
