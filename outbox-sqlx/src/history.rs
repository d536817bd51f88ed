//! History entries as the SQL stores append them in batches.

use outbox_core::EventId;
use outbox_core::store::AttemptKind;
use serde_json::{Value, json};

use crate::codes;

/// One row for the attempts table.
#[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
pub(crate) struct HistoryEntry<'a> {
    pub(crate) event_id: EventId,
    pub(crate) kind: AttemptKind,
    pub(crate) actor: &'a str,
    pub(crate) error_class: Option<&'a str>,
    pub(crate) detail: &'a str,
    pub(crate) attempts: i64,
}

#[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
impl HistoryEntry<'_> {
    /// Entries as the JSON array the batch insert reads (`json_each` / `JSON_TABLE`).
    pub(crate) fn batch_json(entries: &[HistoryEntry<'_>]) -> String {
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
