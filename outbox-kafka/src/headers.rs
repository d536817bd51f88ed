//! Message headers: the event's identity and context.

use outbox_core::StoredEvent;
use rdkafka::message::{Header, OwnedHeaders};

/// Header names (besides the event's own headers, see `outbox_core::Headers`).
pub mod names {
    /// The event id.
    pub const EVENT_ID: &str = "event_id";
    /// The event type.
    pub const EVENT_TYPE: &str = "event_type";
    /// The aggregate kind.
    pub const AGGREGATE_TYPE: &str = "aggregate_type";
    /// The aggregate id.
    pub const AGGREGATE_ID: &str = "aggregate_id";
    /// The payload schema version.
    pub const PAYLOAD_VERSION: &str = "payload_version";
}

/// The headers a message carries for `event`.
pub fn message_headers(event: &StoredEvent) -> OwnedHeaders {
    let event_id = event.event_id.to_string();
    let version = event.payload_version.to_string();
    let mut headers = OwnedHeaders::new_with_capacity(8)
        .insert(Header {
            key: names::EVENT_ID,
            value: Some(event_id.as_bytes()),
        })
        .insert(Header {
            key: names::EVENT_TYPE,
            value: Some(event.event_type.as_bytes()),
        })
        .insert(Header {
            key: names::AGGREGATE_TYPE,
            value: Some(event.aggregate_type.as_bytes()),
        })
        .insert(Header {
            key: names::AGGREGATE_ID,
            value: Some(event.aggregate_id.as_bytes()),
        })
        .insert(Header {
            key: names::PAYLOAD_VERSION,
            value: Some(version.as_bytes()),
        });
    for (name, value) in event.headers.iter() {
        headers = headers.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    headers
}
