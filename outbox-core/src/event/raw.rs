//! A row as a store reads it back, before it is trusted as an event.
//!
//! Rows can be written by other tools (plain SQL, another language, an old
//! version), so decoding can fail. A store decodes each row on its own: one
//! row that does not decode fails alone ("bad rows fail
//! alone") and its neighbours are published.

use chrono::{DateTime, Utc};

use super::{EventId, Headers, NewEvent, Payload, StoredEvent};

/// The columns of one stored event, as the store read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawEvent {
    /// Store-assigned sequence.
    pub sequence: i64,
    /// The event id.
    pub event_id: EventId,
    /// Business entity kind.
    pub aggregate_type: String,
    /// Business entity id.
    pub aggregate_id: String,
    /// What happened.
    pub event_type: String,
    /// Ordering key.
    pub partition_key: String,
    /// Payload JSON text.
    pub payload: String,
    /// Payload schema version as stored.
    pub payload_version: i64,
    /// Headers as stored ([`Headers::to_flat_json`]).
    pub headers: String,
    /// When the row was written.
    pub created_at: DateTime<Utc>,
    /// Earliest publish time.
    pub available_at: DateTime<Utc>,
    /// Failed attempts so far.
    pub attempts: i64,
}

/// A row that is not a valid event, with the reason, and the event as far
/// as it could be read (for admin listings and alerts: fields that did not
/// decode are left empty or hold the raw text as a JSON string).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadableEvent {
    /// The row, as far as it could be read.
    pub event: StoredEvent,
    /// What is wrong with it.
    pub reason: String,
}

impl RawEvent {
    /// The event, or why the row is not one.
    // Both variants carry a whole event; boxing one would not shrink it.
    #[allow(clippy::result_large_err)]
    pub fn decode(self) -> Result<StoredEvent, UnreadableEvent> {
        let mut problems = Vec::new();
        let headers = Headers::from_flat_json(&self.headers).unwrap_or_else(|e| {
            problems.push(e);
            Headers::default()
        });
        let payload = Payload::from_json_text(self.payload.clone()).unwrap_or_else(|e| {
            problems.push(format!("payload: {e}"));
            Payload::from_serialize(&self.payload).expect("a string serializes")
        });
        let payload_version = u32::try_from(self.payload_version).unwrap_or_else(|_| {
            problems.push(format!(
                "payload_version {} is not a u32",
                self.payload_version
            ));
            0
        });
        for (field, value) in [
            ("event_type", &self.event_type),
            ("aggregate_type", &self.aggregate_type),
            ("aggregate_id", &self.aggregate_id),
            ("partition_key", &self.partition_key),
        ] {
            if value.trim().is_empty() {
                problems.push(format!("event field `{field}` is empty"));
            }
        }
        let event = StoredEvent {
            sequence: self.sequence,
            event: NewEvent {
                event_id: self.event_id,
                aggregate_type: self.aggregate_type,
                aggregate_id: self.aggregate_id,
                event_type: self.event_type,
                partition_key: self.partition_key,
                payload,
                payload_version,
                headers,
                available_at: None,
            },
            created_at: self.created_at,
            available_at: self.available_at,
            attempts: u32::try_from(self.attempts.max(0)).unwrap_or(u32::MAX),
        };
        if problems.is_empty() {
            Ok(event)
        } else {
            Err(UnreadableEvent {
                event,
                reason: format!("row does not decode: {}", problems.join("; ")),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(headers: &str, payload: &str) -> RawEvent {
        RawEvent {
            sequence: 7,
            event_id: EventId::random(),
            aggregate_type: "invoice".into(),
            aggregate_id: "inv-1".into(),
            event_type: "invoice.paid".into(),
            partition_key: "inv-1".into(),
            payload: payload.into(),
            payload_version: 1,
            headers: headers.into(),
            created_at: DateTime::from_timestamp(0, 0).unwrap(),
            available_at: DateTime::from_timestamp(0, 0).unwrap(),
            attempts: 0,
        }
    }

    #[test]
    fn a_valid_row_decodes() {
        let event = raw(r#"{"tenant":"acme"}"#, r#"{"a":1}"#).decode().unwrap();
        assert_eq!(event.headers.extra["tenant"], "acme");
        assert_eq!(event.payload.as_str(), r#"{"a":1}"#);
    }

    #[test]
    fn a_bad_row_says_why_and_keeps_what_it_can() {
        let bad = raw(r#"{"traceparent": 5}"#, "not json")
            .decode()
            .unwrap_err();
        assert!(bad.reason.contains("traceparent"), "{}", bad.reason);
        assert!(bad.reason.contains("payload"), "{}", bad.reason);
        assert_eq!(bad.event.sequence, 7);
        assert_eq!(bad.event.payload.as_str(), r#""not json""#);
        let mut empty = raw("{}", "{}");
        empty.event_type = String::new();
        assert!(empty.decode().unwrap_err().reason.contains("event_type"));
    }
}
