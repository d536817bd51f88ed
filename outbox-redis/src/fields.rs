//! How an event is laid out as stream entry fields, and read back.

use std::collections::HashMap;

use outbox_core::chrono::{DateTime, Utc};
use outbox_core::event::wire;
use outbox_core::{EventId, Headers, StoredEvent};
use redis::Value;

/// Field names of an entry: the envelope every broker adapter writes
/// ([`outbox_core::event::wire`]), plus the payload.
pub mod names {
    pub use outbox_core::event::wire::names::*;
    /// Prefix of header fields in entries written before the envelope was
    /// shared (`h.traceparent`); still read, never written.
    pub const LEGACY_HEADER_PREFIX: &str = "h.";
}

/// The entry's fields for `event`, in a fixed order: the envelope's
/// identity, the payload, then the event's headers under their own names.
pub fn entry_fields(event: &StoredEvent) -> Vec<(String, Vec<u8>)> {
    let mut fields: Vec<(String, Vec<u8>)> = wire::identity(event)
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value.into_bytes()))
        .collect();
    fields.push((names::PAYLOAD.into(), event.payload.as_bytes().to_vec()));
    let (own, packed) = wire::headers(event);
    for (name, value) in own {
        fields.push((name.to_owned(), value.as_bytes().to_vec()));
    }
    if let Some(packed) = packed {
        fields.push((names::PACKED_HEADERS.into(), packed.into_bytes()));
    }
    fields
}

/// An event as a consumer reads it from a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamEvent {
    /// The stream it was read from.
    pub stream: String,
    /// The entry id (`<ms>-<seq>`).
    pub entry_id: String,
    /// The event id.
    pub event_id: EventId,
    /// The event type.
    pub event_type: String,
    /// The ordering key.
    pub partition_key: String,
    /// The aggregate kind.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The payload schema version.
    pub payload_version: u32,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// When the event was enqueued (store time); `None` for entries written
    /// before the field existed.
    pub occurred_at: Option<DateTime<Utc>>,
    /// Correlation, causation, trace context and free headers.
    pub headers: Headers,
}

/// Why an entry is not an outbox event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stream entry {entry_id} is not an outbox event: {reason}")]
pub struct DecodeError {
    /// The entry.
    pub entry_id: String,
    /// What is wrong.
    pub reason: String,
}

outbox_core::consumed_from_fields!(StreamEvent);

impl StreamEvent {
    /// Reads an entry's fields.
    pub fn decode(
        stream: &str,
        entry_id: &str,
        fields: &HashMap<String, Value>,
    ) -> Result<Self, DecodeError> {
        let fail = |reason: String| DecodeError {
            entry_id: entry_id.to_owned(),
            reason,
        };
        let bytes = |name: &str| -> Result<Vec<u8>, DecodeError> {
            match fields.get(name) {
                Some(Value::BulkString(b)) => Ok(b.clone()),
                Some(Value::SimpleString(s)) => Ok(s.clone().into_bytes()),
                other => Err(fail(format!("field {name}: {other:?}"))),
            }
        };
        let text = |name: &str| -> Result<String, DecodeError> {
            String::from_utf8(bytes(name)?).map_err(|e| fail(format!("field {name}: {e}")))
        };
        // Every field but the payload is text: the envelope's identity, and
        // headers (under their own names, packed, or as `h.name` in entries
        // from earlier versions).
        let mut pairs: Vec<(String, String)> = Vec::with_capacity(fields.len());
        for name in fields.keys().filter(|name| *name != names::PAYLOAD) {
            let header = name
                .strip_prefix(names::LEGACY_HEADER_PREFIX)
                .unwrap_or(name);
            pairs.push((header.to_owned(), text(name)?));
        }
        let envelope = wire::read_envelope(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(fail)?;
        let required = |name: &str| -> Result<String, DecodeError> {
            envelope
                .identity
                .get(name)
                .cloned()
                .ok_or_else(|| fail(format!("field {name} is missing")))
        };
        let occurred_at = envelope.occurred_at().map_err(fail)?;
        Ok(Self {
            stream: stream.to_owned(),
            entry_id: entry_id.to_owned(),
            event_id: required(names::EVENT_ID)?
                .parse()
                .map_err(|e| fail(format!("event_id: {e}")))?,
            event_type: required(names::EVENT_TYPE)?,
            partition_key: required(names::PARTITION_KEY)?,
            aggregate_type: required(names::AGGREGATE_TYPE)?,
            aggregate_id: required(names::AGGREGATE_ID)?,
            payload_version: required(names::PAYLOAD_VERSION)?
                .parse()
                .map_err(|e| fail(format!("payload_version: {e}")))?,
            payload: bytes(names::PAYLOAD)?,
            occurred_at,
            headers: envelope.headers,
        })
    }
}
