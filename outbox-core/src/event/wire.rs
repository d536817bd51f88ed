//! The names every broker adapter writes an event under, so a consumer reads
//! the same envelope from Kafka headers, Redis stream fields and SNS/SQS
//! message attributes.
//!
//! * The identity and metadata, [`names`]: `event_id`, `event_type`,
//!   `partition_key`, `aggregate_type`, `aggregate_id`, `payload_version`,
//!   and `occurred_at` (when the event was enqueued, on store time, RFC 3339
//!   in UTC with microseconds: `2026-12-01T05:36:23.123456Z`).
//! * The event's [`Headers`](super::Headers) under their own names
//!   (`correlation_id`, `causation_id`, `traceparent`, free ones). A free
//!   header may not take a [reserved](is_reserved) name: enqueue refuses it
//!   ([`InvalidEvent::ReservedHeader`](super::InvalidEvent::ReservedHeader)).
//!   One that another tool wrote into the table travels packed in
//!   [`names::PACKED_HEADERS`] (a flat JSON object of strings), so it never
//!   overwrites the identity and is never dropped; [`read_envelope`] merges
//!   it back. (SNS also packs the headers that do not fit its 10
//!   attributes there.)
//! * The payload as the broker's body (Redis: the `payload` field).

use chrono::{DateTime, SecondsFormat, Utc};

use super::StoredEvent;

/// The envelope's names.
pub mod names {
    /// The event id.
    pub const EVENT_ID: &str = "event_id";
    /// The event type.
    pub const EVENT_TYPE: &str = "event_type";
    /// The ordering key (on Kafka also the message key, on SNS FIFO the
    /// message group).
    pub const PARTITION_KEY: &str = "partition_key";
    /// The aggregate kind.
    pub const AGGREGATE_TYPE: &str = "aggregate_type";
    /// The aggregate id.
    pub const AGGREGATE_ID: &str = "aggregate_id";
    /// The payload schema version.
    pub const PAYLOAD_VERSION: &str = "payload_version";
    /// When the event was enqueued (RFC 3339, UTC, microseconds).
    pub const OCCURRED_AT: &str = "occurred_at";
    /// Redis only: the payload field.
    pub const PAYLOAD: &str = "payload";
    /// SNS only: headers packed into one attribute when they do not fit.
    pub const PACKED_HEADERS: &str = "outbox_headers";
}

/// The identity and metadata names, in the order adapters write them.
pub const IDENTITY: [&str; 7] = [
    names::EVENT_ID,
    names::EVENT_TYPE,
    names::PARTITION_KEY,
    names::AGGREGATE_TYPE,
    names::AGGREGATE_ID,
    names::PAYLOAD_VERSION,
    names::OCCURRED_AT,
];

/// Whether a header may not be called `name` (an envelope name).
pub fn is_reserved(name: &str) -> bool {
    IDENTITY.contains(&name) || name == names::PAYLOAD || name == names::PACKED_HEADERS
}

/// `event`'s identity and metadata as `(name, value)`, in [`IDENTITY`] order.
pub fn identity(event: &StoredEvent) -> [(&'static str, String); 7] {
    [
        (names::EVENT_ID, event.event_id.to_string()),
        (names::EVENT_TYPE, event.event_type.clone()),
        (names::PARTITION_KEY, event.partition_key.clone()),
        (names::AGGREGATE_TYPE, event.aggregate_type.clone()),
        (names::AGGREGATE_ID, event.aggregate_id.clone()),
        (names::PAYLOAD_VERSION, event.payload_version.to_string()),
        (names::OCCURRED_AT, format_occurred_at(event.created_at)),
    ]
}

/// The event's own headers as `(name, value)`, and the packed
/// [`names::PACKED_HEADERS`] value holding any under a reserved name.
pub fn headers(event: &StoredEvent) -> (Vec<(&str, &str)>, Option<String>) {
    let (own, reserved): (Vec<_>, Vec<_>) = event
        .headers
        .iter()
        .partition(|(name, _)| !is_reserved(name));
    (own, pack(reserved))
}

/// `headers` as one flat JSON object of strings, or `None` if there are none.
pub fn pack<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<String> {
    let map: serde_json::Map<String, serde_json::Value> = headers
        .into_iter()
        .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v.to_owned())))
        .collect();
    (!map.is_empty()).then(|| serde_json::Value::Object(map).to_string())
}

/// An envelope read back: the identity values present, and every header
/// (own ones and packed ones merged).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Envelope {
    /// Identity and metadata values by name (missing ones absent).
    pub identity: std::collections::BTreeMap<&'static str, String>,
    /// Every header.
    pub headers: super::Headers,
}

impl Envelope {
    /// The identity value `name`, or empty.
    pub fn get(&self, name: &str) -> &str {
        self.identity.get(name).map_or("", String::as_str)
    }

    /// `occurred_at`: `None` when absent (written before it existed), an
    /// error naming the value when it is not RFC 3339.
    pub fn occurred_at(&self) -> Result<Option<DateTime<Utc>>, String> {
        self.identity
            .get(names::OCCURRED_AT)
            .map(|at| {
                parse_occurred_at(at).ok_or_else(|| format!("occurred_at {at:?} is not RFC 3339"))
            })
            .transpose()
    }
}

/// Reads `(name, value)` pairs a publisher wrote (the payload excluded).
/// Fails only on a packed-headers value that is not a flat JSON object of
/// strings: nothing is dropped silently.
pub fn read_envelope<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Envelope, String> {
    let mut envelope = Envelope::default();
    let mut headers: Vec<(String, String)> = Vec::new();
    for (name, value) in pairs {
        if let Some(known) = IDENTITY.iter().find(|known| **known == name) {
            envelope.identity.insert(known, value.to_owned());
        } else if name == names::PACKED_HEADERS {
            let packed = super::Headers::from_flat_json(value)
                .map_err(|e| format!("{}: {e}", names::PACKED_HEADERS))?;
            headers.extend(packed.iter().map(|(k, v)| (k.to_owned(), v.to_owned())));
        } else if name != names::PAYLOAD {
            headers.push((name.to_owned(), value.to_owned()));
        }
    }
    envelope.headers =
        super::Headers::from_pairs(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Ok(envelope)
}

/// `at` as the `occurred_at` value.
pub fn format_occurred_at(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Reads an `occurred_at` value; `None` if it is not RFC 3339.
pub fn parse_occurred_at(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|at| at.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EventId, NewEvent};

    fn stored_event() -> StoredEvent {
        let event = NewEvent::builder("invoice.paid", "invoice", "inv-1")
            .event_id(EventId::random())
            .payload(&1)
            .build()
            .unwrap();
        StoredEvent {
            sequence: 1,
            event,
            created_at: Utc::now(),
            available_at: Utc::now(),
            attempts: 0,
        }
    }

    #[test]
    fn occurred_at_round_trips_with_microseconds() {
        let at = DateTime::parse_from_rfc3339("2026-12-01T05:36:23.123456Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(format_occurred_at(at), "2026-12-01T05:36:23.123456Z");
        assert_eq!(parse_occurred_at(&format_occurred_at(at)), Some(at));
        assert_eq!(parse_occurred_at("yesterday"), None);
    }

    #[test]
    fn a_reserved_free_header_travels_packed_and_comes_back() {
        let mut event = stored_event();
        event
            .event
            .headers
            .extra
            .insert("event_id".into(), "forged".into());
        event
            .event
            .headers
            .extra
            .insert("tenant".into(), "acme".into());
        let (own, packed) = headers(&event);
        assert_eq!(own, [("tenant", "acme")]);
        let packed = packed.unwrap();
        assert_eq!(packed, r#"{"event_id":"forged"}"#);
        let identity = identity(&event);
        let pairs = identity
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .chain(own)
            .chain([(names::PACKED_HEADERS, packed.as_str())]);
        let read = read_envelope(pairs).unwrap();
        assert_eq!(read.get(names::EVENT_ID), event.event_id.to_string());
        assert_eq!(read.headers, event.headers, "nothing dropped");
        assert!(read_envelope([(names::PACKED_HEADERS, "[1]")]).is_err());
    }

    #[test]
    fn enqueue_refuses_a_free_header_with_a_reserved_name() {
        for name in ["occurred_at", "event_id", "payload", "outbox_headers"] {
            let mut event = stored_event().event;
            event.headers.extra.insert(name.into(), "x".into());
            assert_eq!(
                crate::EventLimits::default().check(&event),
                Err(crate::InvalidEvent::ReservedHeader(name.into()))
            );
        }
    }
}
