//! How an event is laid out as SNS/SQS message attributes, and read back.
//!
//! SNS delivers at most **10 message attributes** to an SQS subscriber, so
//! the layout is fixed and never exceeds it:
//!
//! * seven identity attributes: `event_id`, `event_type`, `partition_key`,
//!   `aggregate_type`, `aggregate_id`, `payload_version`, `occurred_at` (the
//!   envelope every adapter writes, [`outbox_core::event::wire`]: the Redis
//!   publisher as fields, the Kafka publisher as headers);
//! * the event's headers under their own names (`correlation_id`,
//!   `causation_id`, `traceparent`, free headers) when they all fit in the
//!   three slots left and each is a valid attribute (a legal name, not one of
//!   the names above, a non-empty value);
//! * otherwise two valid headers (`traceparent` first, then
//!   `correlation_id`, then the rest in order) keep their own attributes and **every other header is packed** into one
//!   attribute, [`names::PACKED_HEADERS`], as a flat JSON object of strings.
//!
//! Nothing is dropped: [`read_attributes`] merges both forms back, so a
//! consumer sees the same headers whatever their count.

use outbox_core::event::wire;
use outbox_core::{Headers, StoredEvent};

/// Attribute names: the envelope every broker adapter writes
/// ([`outbox_core::event::wire`]).
pub mod names {
    pub use outbox_core::event::wire::names::*;
}

/// Most message attributes SNS delivers to SQS.
pub const MAX_ATTRIBUTES: usize = 10;

const IDENTITY: [&str; 7] = wire::IDENTITY;

/// The data type every attribute is sent with.
pub const DATA_TYPE: &str = "String";

/// The attributes `event` is published with, in a fixed order; never more
/// than [`MAX_ATTRIBUTES`].
pub fn message_attributes(event: &StoredEvent) -> Vec<(String, String)> {
    let mut attributes: Vec<(String, String)> = wire::identity(event)
        .into_iter()
        // SNS refuses an empty string attribute; a consumer reads a missing
        // identity attribute as empty.
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    let slots = MAX_ATTRIBUTES - IDENTITY.len();
    let (mut own, mut packed): (Vec<_>, Vec<_>) = event
        .headers
        .iter()
        .partition(|(name, value)| can_be_own_attribute(name, value));
    // When slots run short, trace context keeps its own attribute first
    // (what tracing integrations read), then correlation, then the rest.
    own.sort_by_key(|(name, _)| match *name {
        Headers::TRACEPARENT => 0,
        Headers::CORRELATION_ID => 1,
        _ => 2,
    });
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
pub type ReadAttributes = wire::Envelope;

/// Reads attributes written by [`message_attributes`]. Fails only on a
/// packed-headers attribute that is not a flat JSON object of strings.
pub fn read_attributes<'a>(
    attributes: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<ReadAttributes, String> {
    wire::read_envelope(attributes).map_err(|e| format!("attribute {e}"))
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
    fn three_headers_get_attributes_of_their_own() {
        let event = event_with_headers(3);
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
        for well_known in ["traceparent", "correlation_id"] {
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
        assert_eq!(
            attributes.len(),
            8,
            "seven identity attributes and the pack"
        );
        assert_eq!(round_trip(&attributes).headers, event.headers);
    }

    #[test]
    fn a_bad_pack_is_an_error_not_a_silent_loss() {
        let err = read_attributes([(names::PACKED_HEADERS, "[1]")]).unwrap_err();
        assert!(err.contains(names::PACKED_HEADERS), "{err}");
    }
}
