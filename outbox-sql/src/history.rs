//! History entries as the SQL stores append them in batches.

use outbox_core::EventId;
use outbox_core::store::{AttemptKind, OperatorAction};
use serde_json::{Value, json};

use crate::codes;

/// The history detail of an event superseded by `replacement`.
pub fn superseded_detail(replacement: &outbox_core::NewEvent, action: &OperatorAction) -> String {
    format!("superseded by {}: {}", replacement.event_id, action.reason)
}

/// One row for the attempts table.
pub struct HistoryEntry<'a> {
    /// The event.
    pub event_id: EventId,
    /// What happened.
    pub kind: AttemptKind,
    /// Who did it (relay id or operator).
    pub actor: &'a str,
    /// The publish error class, if one.
    pub error_class: Option<&'a str>,
    /// The error or the operator's reason.
    pub detail: &'a str,
    /// The event's attempt count after this entry.
    pub attempts: i64,
}

impl<'a> HistoryEntry<'a> {
    /// An operator's action (`kind`) on `event_id`, with `detail` (the
    /// reason) and the attempts the event is left with.
    pub fn operator(
        event_id: EventId,
        kind: AttemptKind,
        action: &'a OperatorAction,
        detail: &'a str,
        attempts: i64,
    ) -> Self {
        Self {
            event_id,
            kind,
            actor: action.operator.as_str(),
            error_class: None,
            detail,
            attempts,
        }
    }

    /// Entries as the JSON array the batch insert reads (`json_each` / `JSON_TABLE`).
    pub fn batch_json(entries: &[HistoryEntry<'_>]) -> String {
        let rows: Vec<Value> = entries
            .iter()
            .map(|e| {
                json!({
                    "id": e.event_id.to_string(),
                    "k": codes::attempt_kind_code(e.kind),
                    "actor": e.actor,
                    "c": e.error_class,
                    "d": e.detail,
                    "n": e.attempts,
                })
            })
            .collect();
        Value::Array(rows).to_string()
    }
}
