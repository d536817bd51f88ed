//! Decoding MySQL rows into core types.

use chrono::{DateTime, Utc};
use outbox_core::store::AttemptRecord;
use outbox_core::{EventId, Headers, NewEvent, StoreError, StoredEvent};
use sqlx::Row;
use sqlx::mysql::MySqlRow;

use crate::error::ResultExt;

/// Times are stored as microseconds since the Unix epoch: integers compare
/// and index exactly, unlike text timestamps of varying precision.
pub(super) fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

pub(super) fn from_micros(micros: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::fatal(format!("stored time {micros} out of range")))
}

pub(super) fn time(row: &MySqlRow, column: &str) -> Result<DateTime<Utc>, StoreError> {
    from_micros(row.try_get(column).store()?)
}

/// Text from a column: binary-collated text (`utf8mb4_bin`, used so keys
/// compare case-sensitively) arrives flagged binary, so decode bytes as UTF-8.
pub(super) fn text(row: &MySqlRow, column: &str) -> Result<String, StoreError> {
    opt_text(row, column)?.ok_or_else(|| StoreError::fatal(format!("column {column} is NULL")))
}

/// Like [`text`], for a nullable column.
pub(super) fn opt_text(row: &MySqlRow, column: &str) -> Result<Option<String>, StoreError> {
    let bytes: Option<Vec<u8>> = row.try_get(column).store()?;
    bytes
        .map(|b| String::from_utf8(b).map_err(StoreError::fatal))
        .transpose()
}

pub(super) fn event_id(row: &MySqlRow, column: &str) -> Result<EventId, StoreError> {
    let text = text(row, column)?;
    text.parse()
        .map_err(|e| StoreError::fatal(format!("stored event id {text:?}: {e}")))
}

pub(super) fn stored_event(row: &MySqlRow) -> Result<StoredEvent, StoreError> {
    let headers = text(row, "headers")?;
    let headers: Headers = serde_json::from_str(&headers).map_err(StoreError::fatal)?;
    let payload = text(row, "payload")?;
    let payload_version: i32 = row.try_get("payload_version").store()?;
    let attempts: i32 = row.try_get("attempts").store()?;
    let event = NewEvent::builder(
        text(row, "event_type")?,
        text(row, "aggregate_type")?,
        text(row, "aggregate_id")?,
    )
    .event_id(event_id(row, "event_id")?)
    .partition_key(text(row, "partition_key")?)
    .payload_json(payload)
    .payload_version(payload_version as u32)
    .headers(headers)
    .build()
    .map_err(|e| StoreError::fatal(format!("stored event does not decode: {e}")))?;
    Ok(StoredEvent {
        sequence: row.try_get("sequence").store()?,
        event,
        created_at: time(row, "created_at")?,
        available_at: time(row, "available_at")?,
        attempts: attempts as u32,
    })
}

pub(super) fn attempt_record(row: &MySqlRow) -> Result<AttemptRecord, StoreError> {
    let kind = text(row, "kind")?;
    let error_class = opt_text(row, "error_class")?;
    let attempts: i32 = row.try_get("attempts").store()?;
    Ok(AttemptRecord {
        kind: crate::codes::attempt_kind(&kind)?,
        at: time(row, "at")?,
        actor: text(row, "actor")?,
        error_class: error_class
            .as_deref()
            .map(crate::codes::error_class)
            .transpose()?,
        detail: text(row, "detail")?,
        attempts: attempts as u32,
    })
}
