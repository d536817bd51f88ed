//! An enqueue as column arrays (one statement for the whole batch), and the
//! outcomes read back from the ids it inserted: what every SQL adapter
//! binds and maps, whatever the driver.

use std::collections::HashMap;

use outbox_core::store::EnqueueOutcome;
use outbox_core::{NewEvent, StoreError};
use uuid::Uuid;

use crate::config::StoreConfig;
use crate::validate::{check_event, headers_json};

/// The batch's columns, in event order, after every event passed the
/// checks (nothing is sent otherwise, so the caller's transaction stays
/// usable).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnqueueColumns<'a> {
    /// Event ids.
    pub event_ids: Vec<Uuid>,
    /// Aggregate kinds.
    pub aggregate_types: Vec<&'a str>,
    /// Aggregate ids.
    pub aggregate_ids: Vec<&'a str>,
    /// Event types.
    pub event_types: Vec<&'a str>,
    /// Ordering keys.
    pub partition_keys: Vec<&'a str>,
    /// Payloads, JSON text.
    pub payloads: Vec<&'a str>,
    /// Payload schema versions.
    pub payload_versions: Vec<i32>,
    /// Headers as flat JSON objects.
    pub headers: Vec<String>,
    /// Delays until available, in milliseconds by the host clock (`None`:
    /// as soon as committed).
    pub delays_ms: Vec<Option<i64>>,
}

impl<'a> EnqueueColumns<'a> {
    /// Checks every event against `config`'s limits (`json_refuses_nul`:
    /// the store cannot keep U+0000 in JSON, as PostgreSQL `jsonb`), then
    /// lays the batch out as columns.
    pub fn checked(
        events: &'a [NewEvent],
        config: &StoreConfig,
        json_refuses_nul: bool,
    ) -> Result<Self, StoreError> {
        for event in events {
            check_event(event, &config.limits, json_refuses_nul)?;
        }
        Ok(Self {
            event_ids: events.iter().map(|e| *e.event_id.as_uuid()).collect(),
            aggregate_types: events.iter().map(|e| e.aggregate_type.as_str()).collect(),
            aggregate_ids: events.iter().map(|e| e.aggregate_id.as_str()).collect(),
            event_types: events.iter().map(|e| e.event_type.as_str()).collect(),
            partition_keys: events.iter().map(|e| e.partition_key.as_str()).collect(),
            payloads: events.iter().map(|e| e.payload.as_str()).collect(),
            payload_versions: events.iter().map(|e| e.payload_version as i32).collect(),
            headers: events.iter().map(headers_json).collect(),
            delays_ms: events
                .iter()
                .map(|e| config.delay_ms(e.available_at))
                .collect(),
        })
    }
}

/// Each event's outcome, given the `(event_id, sequence)` of the rows the
/// statement inserted: an id it did not insert already existed (a
/// duplicate inside one batch: the first occurrence was written).
pub fn outcomes(
    events: &[NewEvent],
    inserted: impl IntoIterator<Item = (Uuid, i64)>,
) -> Vec<EnqueueOutcome> {
    let mut inserted: HashMap<Uuid, i64> = inserted.into_iter().collect();
    events
        .iter()
        .map(|e| match inserted.remove(e.event_id.as_uuid()) {
            Some(sequence) => EnqueueOutcome::Inserted { sequence },
            None => EnqueueOutcome::AlreadyExists,
        })
        .collect()
}

/// [`outcomes`] from the rows an enqueue statement returned (`event_id`,
/// `sequence`).
pub fn outcomes_of_rows(
    events: &[NewEvent],
    rows: &[crate::row::Row],
) -> Result<Vec<EnqueueOutcome>, StoreError> {
    let inserted = rows
        .iter()
        .map(|r| Ok((*r.event_id("event_id")?.as_uuid(), r.int("sequence")?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(outcomes(events, inserted))
}

#[cfg(test)]
mod tests {
    use outbox_core::EventId;

    use super::*;

    fn event(id: EventId) -> NewEvent {
        NewEvent::builder("invoice.paid", "invoice", "inv-1")
            .event_id(id)
            .payload(&1)
            .build()
            .unwrap()
    }

    #[test]
    fn a_duplicate_inside_one_batch_is_reported_after_the_first() {
        let id = EventId::random();
        let events = [event(id), event(id)];
        let outcomes = outcomes(&events, [(*id.as_uuid(), 7)]);
        assert_eq!(
            outcomes,
            [
                EnqueueOutcome::Inserted { sequence: 7 },
                EnqueueOutcome::AlreadyExists
            ]
        );
    }

    #[test]
    fn a_bad_event_anywhere_refuses_the_batch_before_anything_is_laid_out() {
        let mut bad = event(EventId::random());
        bad.partition_key = String::new();
        let events = [event(EventId::random()), bad];
        assert!(EnqueueColumns::checked(&events, &StoreConfig::default(), true).is_err());
        let good = [event(EventId::random())];
        let columns = EnqueueColumns::checked(&good, &StoreConfig::default(), true).unwrap();
        assert_eq!(columns.partition_keys, ["inv-1"]);
        assert_eq!(columns.delays_ms, [None]);
    }
}
