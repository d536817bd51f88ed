//! Message headers: the event's envelope ([`outbox_core::event::wire`], the
//! names every broker adapter writes) and its own headers.

use outbox_core::StoredEvent;
use outbox_core::event::wire;
use rdkafka::message::{Header, OwnedHeaders};

/// Header names: the shared envelope's.
pub mod names {
    pub use outbox_core::event::wire::names::*;
}

/// The headers a message carries for `event`: the envelope's identity and
/// `occurred_at`, then the event's own headers under their own names.
pub fn message_headers(event: &StoredEvent) -> OwnedHeaders {
    let identity = wire::identity(event);
    let mut headers =
        OwnedHeaders::new_with_capacity(identity.len() + event.headers.extra.len() + 3);
    for (name, value) in &identity {
        headers = headers.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    let (own, packed) = wire::headers(event);
    for (name, value) in own {
        headers = headers.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    if let Some(packed) = &packed {
        headers = headers.insert(Header {
            key: names::PACKED_HEADERS,
            value: Some(packed.as_bytes()),
        });
    }
    headers
}
