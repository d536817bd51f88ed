//! Checks at enqueue that go beyond the core's limits: what a SQL store
//! cannot hold. A typed error, never a silently altered row.

use outbox_core::{EventLimits, InvalidEvent, NewEvent};

/// [`check_event`] on each of `events`: whether there is anything to
/// write (an empty batch is no error).
pub fn check_events(
    events: &[NewEvent],
    limits: &EventLimits,
    json_refuses_nul: bool,
) -> Result<bool, InvalidEvent> {
    for event in events {
        check_event(event, limits, json_refuses_nul)?;
    }
    Ok(!events.is_empty())
}

/// Checks `event` against `limits` and against characters SQL text columns
/// refuse (NUL), plus U+0000 inside JSON when `json_refuses_nul` (PostgreSQL
/// `jsonb`).
pub fn check_event(
    event: &NewEvent,
    limits: &EventLimits,
    json_refuses_nul: bool,
) -> Result<(), InvalidEvent> {
    limits.check(event)?;
    let text_fields = [
        &event.event_type,
        &event.aggregate_type,
        &event.aggregate_id,
        &event.partition_key,
    ];
    let nul_in_headers = event
        .headers
        .iter()
        .any(|(k, v)| k.contains('\0') || v.contains('\0'));
    if text_fields.iter().any(|f| f.contains('\0')) || nul_in_headers {
        return Err(InvalidEvent::UnstorableCharacter(
            "NUL (U+0000) in a text field or header",
        ));
    }
    if json_refuses_nul && event.payload.contains_nul_char() {
        return Err(InvalidEvent::UnstorableCharacter(
            "U+0000 in a JSON string: PostgreSQL jsonb cannot store it",
        ));
    }
    Ok(())
}

/// The headers as the JSON object stored beside the event: flat, string
/// values only ([`outbox_core::Headers::to_flat_json`]).
pub fn headers_json(event: &NewEvent) -> String {
    event.headers.to_flat_json()
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::EventId;

    fn event() -> NewEvent {
        NewEvent::builder("invoice.paid", "invoice", "inv-1")
            .event_id(EventId::random())
            .payload(&serde_json::json!({"memo": "a\u{0}b"}))
            .build()
            .unwrap()
    }

    #[test]
    fn nul_in_json_is_refused_only_where_the_store_cannot_hold_it() {
        let e = event();
        assert!(matches!(
            check_event(&e, &EventLimits::default(), true),
            Err(InvalidEvent::UnstorableCharacter(_))
        ));
        assert!(check_event(&e, &EventLimits::default(), false).is_ok());
    }

    #[test]
    fn nul_in_text_fields_is_refused_everywhere() {
        let mut e = event();
        e.payload = outbox_core::Payload::from_json_text("{}").unwrap();
        e.aggregate_id = "inv\0".into();
        assert!(check_event(&e, &EventLimits::default(), false).is_err());
    }
}
