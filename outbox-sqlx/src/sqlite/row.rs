//! Decoding SQLite rows into core types.

use chrono::{DateTime, Utc};
use outbox_core::store::AttemptRecord;
use outbox_core::{EventId, Headers, NewEvent, StoreError, StoredEvent};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

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

pub(super) fn time(row: &SqliteRow, column: &str) -> Result<DateTime<Utc>, StoreError> {
    from_micros(row.try_get(column).store()?)
}

pub(super) fn event_id(row: &SqliteRow, column: &str) -> Result<EventId, StoreError> {
    let text: String = row.try_get(column).store()?;
    text.parse()
        .map_err(|e| StoreError::fatal(format!("stored event id {text:?}: {e}")))
}

pub(super) fn stored_event(row: &SqliteRow) -> Result<StoredEvent, StoreError> {
    let headers: String = row.try_get("headers").store()?;
    let headers: Headers = serde_json::from_str(&headers).map_err(StoreError::fatal)?;
    let payload: String = row.try_get("payload").store()?;
    let payload_version: i64 = row.try_get("payload_version").store()?;
    let attempts: i64 = row.try_get("attempts").store()?;
    let event = NewEvent::builder(
        row.try_get::<String, _>("event_type").store()?,
        row.try_get::<String, _>("aggregate_type").store()?,
        row.try_get::<String, _>("aggregate_id").store()?,
    )
    .event_id(event_id(row, "event_id")?)
    .partition_key(row.try_get::<String, _>("partition_key").store()?)
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

pub(super) fn attempt_record(row: &SqliteRow) -> Result<AttemptRecord, StoreError> {
    let kind: String = row.try_get("kind").store()?;
    let error_class: Option<String> = row.try_get("error_class").store()?;
    let attempts: i64 = row.try_get("attempts").store()?;
    Ok(AttemptRecord {
        kind: crate::codes::attempt_kind(&kind)?,
        at: time(row, "at")?,
        actor: row.try_get("actor").store()?,
        error_class: error_class
            .as_deref()
            .map(crate::codes::error_class)
            .transpose()?,
        detail: row.try_get("detail").store()?,
        attempts: attempts as u32,
    })
}
