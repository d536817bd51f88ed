//! How an event is laid out as stream entry fields, and read back.

use std::collections::HashMap;

use outbox_core::{EventId, Headers, StoredEvent};
use redis::Value;

/// Field names of an entry.
pub mod names {
    /// The event id.
    pub const EVENT_ID: &str = "event_id";
    /// The event type.
    pub const EVENT_TYPE: &str = "event_type";
    /// The ordering key.
    pub const PARTITION_KEY: &str = "partition_key";
    /// The aggregate kind.
    pub const AGGREGATE_TYPE: &str = "aggregate_type";
    /// The aggregate id.
    pub const AGGREGATE_ID: &str = "aggregate_id";
    /// The payload schema version.
    pub const PAYLOAD_VERSION: &str = "payload_version";
    /// The payload bytes as stored.
    pub const PAYLOAD: &str = "payload";
    /// Prefix of header fields: `h.traceparent`, `h.correlation_id`, …
    pub const HEADER_PREFIX: &str = "h.";
}

/// The entry's fields for `event`, in a fixed order.
pub fn entry_fields(event: &StoredEvent) -> Vec<(String, Vec<u8>)> {
    let mut fields = vec![
        (
            names::EVENT_ID.into(),
            event.event_id.to_string().into_bytes(),
        ),
        (
            names::EVENT_TYPE.into(),
            event.event_type.clone().into_bytes(),
        ),
        (
            names::PARTITION_KEY.into(),
            event.partition_key.clone().into_bytes(),
        ),
        (
            names::AGGREGATE_TYPE.into(),
            event.aggregate_type.clone().into_bytes(),
        ),
        (
            names::AGGREGATE_ID.into(),
            event.aggregate_id.clone().into_bytes(),
        ),
        (
            names::PAYLOAD_VERSION.into(),
            event.payload_version.to_string().into_bytes(),
        ),
        (names::PAYLOAD.into(), event.payload.as_bytes().to_vec()),
    ];
    for (name, value) in event.headers.iter() {
        fields.push((
            format!("{}{name}", names::HEADER_PREFIX),
            value.as_bytes().to_vec(),
        ));
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
        let mut header_pairs = Vec::new();
        for (name, value) in fields {
            if let (Some(header), Value::BulkString(v)) =
                (name.strip_prefix(names::HEADER_PREFIX), value)
            {
                let v = String::from_utf8(v.clone()).map_err(|e| fail(e.to_string()))?;
                header_pairs.push((header.to_owned(), v));
            }
        }
        Ok(Self {
            stream: stream.to_owned(),
            entry_id: entry_id.to_owned(),
            event_id: text(names::EVENT_ID)?
                .parse()
                .map_err(|e| fail(format!("event_id: {e}")))?,
            event_type: text(names::EVENT_TYPE)?,
            partition_key: text(names::PARTITION_KEY)?,
            aggregate_type: text(names::AGGREGATE_TYPE)?,
            aggregate_id: text(names::AGGREGATE_ID)?,
            payload_version: text(names::PAYLOAD_VERSION)?
                .parse()
                .map_err(|e| fail(format!("payload_version: {e}")))?,
            payload: bytes(names::PAYLOAD)?,
            headers: Headers::from_pairs(
                header_pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            ),
        })
    }
}
