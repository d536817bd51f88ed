//! How an event is laid out as SNS/SQS message attributes, and read back.
//!
//! SNS delivers at most **10 message attributes** to an SQS subscriber, so
//! the layout is fixed and never exceeds it:
//!
//! * six identity attributes: `event_id`, `event_type`, `partition_key`,
//!   `aggregate_type`, `aggregate_id`, `payload_version` (the names the Redis
//!   publisher writes as fields and the Kafka publisher as headers);
//! * the event's headers under their own names (`correlation_id`,
//!   `causation_id`, `traceparent`, free headers) when they all fit in the
//!   four slots left and each is a valid attribute (a legal name, not one of
//!   the names above, a non-empty value);
//! * otherwise the first three valid headers (well-known ones come first)
//!   keep their own attributes and **every other header is packed** into one
//!   attribute, [`names::PACKED_HEADERS`], as a flat JSON object of strings.
//!
//! Nothing is dropped: [`read_attributes`] merges both forms back, so a
//! consumer sees the same headers whatever their count.

use std::collections::BTreeMap;

use outbox_core::{Headers, StoredEvent};

/// Attribute names.
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
    /// Headers that did not get an attribute of their own, as a flat JSON
    /// object of string values.
    pub const PACKED_HEADERS: &str = "outbox_headers";
}

/// Most message attributes SNS delivers to SQS.
pub const MAX_ATTRIBUTES: usize = 10;

const IDENTITY: [&str; 6] = [
    names::EVENT_ID,
    names::EVENT_TYPE,
    names::PARTITION_KEY,
    names::AGGREGATE_TYPE,
    names::AGGREGATE_ID,
    names::PAYLOAD_VERSION,
];

/// The data type every attribute is sent with.
pub const DATA_TYPE: &str = "String";

/// The attributes `event` is published with, in a fixed order; never more
/// than [`MAX_ATTRIBUTES`].
pub fn message_attributes(event: &StoredEvent) -> Vec<(String, String)> {
    let identity = [
        event.event_id.to_string(),
        event.event_type.clone(),
        event.partition_key.clone(),
        event.aggregate_type.clone(),
        event.aggregate_id.clone(),
        event.payload_version.to_string(),
    ];
    let mut attributes: Vec<(String, String)> = IDENTITY
        .iter()
        .zip(identity)
        // SNS refuses an empty string attribute; a consumer reads a missing
        // identity attribute as empty.
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| ((*name).to_owned(), value))
        .collect();
    let slots = MAX_ATTRIBUTES - IDENTITY.len();
    let (own, mut packed): (Vec<_>, Vec<_>) = event
        .headers
        .iter()
        .partition(|(name, value)| can_be_own_attribute(name, value));
    let own_count = if packed.is_empty() && own.len() <= slots {
        own.len()
    } else {
        slots - 1
    };
    let mut own = own.into_iter();
    for (name, value) in own.by_ref().take(own_count) {
        attributes.push((name.to_owned(), value.to_owned()));
    }
    packed.extend(own);
    if !packed.is_empty() {
        let map: serde_json::Map<String, serde_json::Value> = packed
            .into_iter()
            .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v.to_owned())))
            .collect();
        attributes.push((
            names::PACKED_HEADERS.to_owned(),
            serde_json::Value::Object(map).to_string(),
        ));
    }
    debug_assert!(attributes.len() <= MAX_ATTRIBUTES);
    attributes
}

/// Bytes SNS counts for `attributes` against its 256 KiB message limit.
pub fn attributes_size(attributes: &[(String, String)]) -> usize {
    attributes
        .iter()
        .map(|(name, value)| name.len() + DATA_TYPE.len() + value.len())
        .sum()
}

/// Whether a header can travel as an attribute of its own: SNS's naming
/// rules (letters, digits, `_`, `-`, `.`; at most 256 bytes; no leading,
/// trailing or repeated dot; no `AWS.`/`Amazon.` prefix), not a name this
/// layout uses itself, and a non-empty value.
fn can_be_own_attribute(name: &str, value: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !value.is_empty()
        && !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
        && !IDENTITY.contains(&name)
        && name != names::PACKED_HEADERS
}

/// An event's identity and headers read back from attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadAttributes {
    /// Identity attributes by name (missing ones absent).
    pub identity: BTreeMap<&'static str, String>,
    /// Every header, own attributes and packed ones merged.
    pub headers: Headers,
}

/// Reads attributes written by [`message_attributes`]. Fails only on a
/// packed-headers attribute that is not a flat JSON object of strings.
pub fn read_attributes<'a>(
    attributes: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<ReadAttributes, String> {
    let mut read = ReadAttributes::default();
    let mut headers: Vec<(String, String)> = Vec::new();
    for (name, value) in attributes {
        if let Some(known) = IDENTITY.iter().find(|known| **known == name) {
            read.identity.insert(known, value.to_owned());
        } else if name == names::PACKED_HEADERS {
            let packed = Headers::from_flat_json(value)
                .map_err(|e| format!("attribute {}: {e}", names::PACKED_HEADERS))?;
            headers.extend(packed.iter().map(|(k, v)| (k.to_owned(), v.to_owned())));
        } else {
            headers.push((name.to_owned(), value.to_owned()));
        }
    }
    read.headers = Headers::from_pairs(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Ok(read)
}

#[cfg(test)]
mod tests {
    use outbox_core::NewEvent;

    use super::*;

    fn stored(event: NewEvent) -> StoredEvent {
        let now = chrono::Utc::now();
        StoredEvent {
            sequence: 1,
            event,
            created_at: now,
            available_at: now,
            attempts: 0,
        }
    }

    fn event_with_headers(n: usize) -> StoredEvent {
        let mut builder = NewEvent::builder("invoice.paid", "invoice", "inv-1")
            .payload_json("{}")
            .event_id(outbox_core::EventId::random())
            .correlation_id("corr-1")
            .causation_id("cause-1")
            .traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        for i in 0..n.saturating_sub(3) {
            builder = builder.header(format!("x-h{i:02}"), format!("value {i}"));
        }
        stored(builder.build().unwrap())
    }

    fn round_trip(attributes: &[(String, String)]) -> ReadAttributes {
        read_attributes(attributes.iter().map(|(k, v)| (k.as_str(), v.as_str()))).unwrap()
    }

    #[test]
    fn four_headers_get_attributes_of_their_own() {
        let event = event_with_headers(4);
        let attributes = message_attributes(&event);
        assert_eq!(attributes.len(), 10);
        assert!(attributes.iter().all(|(k, _)| k != names::PACKED_HEADERS));
        assert_eq!(round_trip(&attributes).headers, event.headers);
    }

    #[test]
    fn fifteen_headers_stay_within_ten_attributes_and_none_is_lost() {
        let event = event_with_headers(15);
        assert_eq!(event.headers.iter().count(), 15);
        let attributes = message_attributes(&event);
        assert_eq!(attributes.len(), MAX_ATTRIBUTES);
        let own: Vec<&str> = attributes.iter().map(|(k, _)| k.as_str()).collect();
        for well_known in ["correlation_id", "causation_id", "traceparent"] {
            assert!(
                own.contains(&well_known),
                "{well_known} keeps its own attribute"
            );
        }
        let read = round_trip(&attributes);
        assert_eq!(read.headers, event.headers);
        assert_eq!(read.identity[names::EVENT_ID], event.event_id.to_string());
        assert_eq!(read.identity[names::PARTITION_KEY], "inv-1");
    }

    #[test]
    fn headers_that_cannot_be_attributes_are_packed_not_dropped() {
        let event = stored(
            NewEvent::builder("invoice.paid", "invoice", "inv-1")
                .payload_json("{}")
                .event_id(outbox_core::EventId::random())
                .header("has space", "x")
                .header("AWS.reserved", "y")
                .header("event_id", "a header named like an identity attribute")
                .header("empty", "")
                .build()
                .unwrap(),
        );
        let attributes = message_attributes(&event);
        assert_eq!(attributes.len(), 7, "six identity attributes and the pack");
        assert_eq!(round_trip(&attributes).headers, event.headers);
    }

    #[test]
    fn a_bad_pack_is_an_error_not_a_silent_loss() {
        let err = read_attributes([(names::PACKED_HEADERS, "[1]")]).unwrap_err();
        assert!(err.contains(names::PACKED_HEADERS), "{err}");
    }
}
