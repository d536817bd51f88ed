//! Decoding SQLite rows into core types.

use chrono::{DateTime, Utc};
use outbox_core::store::AttemptRecord;
use outbox_core::{EventId, RawEvent, StoreError};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use crate::error::ResultExt;

/// Times are stored as microseconds since the Unix epoch: integers compare
/// and index exactly, unlike text timestamps of varying precision.
pub(super) fn from_micros(micros: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::fatal(format!("stored time {micros} out of range")))
}

/// A row's crash suspicion (`suspect`, `suspect_span` columns), as blame
/// reads it.
pub(super) fn suspect(row: &SqliteRow) -> Result<Option<u32>, StoreError> {
    Ok(crate::blame::suspect_span(
        row.try_get("suspect").store()?,
        row.try_get("suspect_span").store()?,
    ))
}

pub(super) fn time(row: &SqliteRow, column: &str) -> Result<DateTime<Utc>, StoreError> {
    from_micros(row.try_get(column).store()?)
}

pub(super) fn opt_time(row: &SqliteRow, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
    row.try_get::<Option<i64>, _>(column)
        .store()?
        .map(from_micros)
        .transpose()
}

pub(super) fn event_id(row: &SqliteRow, column: &str) -> Result<EventId, StoreError> {
    let text: String = row.try_get(column).store()?;
    text.parse()
        .map_err(|e| StoreError::fatal(format!("stored event id {text:?}: {e}")))
}

/// The columns of [`super::queries::EVENT_COLUMNS`], not yet trusted as an
/// event: decoding is [`RawEvent::decode`], per row. SQLite columns take any
/// type, so even a number where text belongs decodes here as its text.
pub(super) fn raw_event(row: &SqliteRow) -> Result<RawEvent, StoreError> {
    let text = |column: &str| -> Result<String, StoreError> {
        let value: sqlx::sqlite::SqliteValueRef<'_> = row.try_get_raw(column).store()?;
        if sqlx::ValueRef::is_null(&value) {
            return Ok(String::new());
        }
        row.try_get::<String, _>(column)
            .or_else(|_| row.try_get::<i64, _>(column).map(|n| n.to_string()))
            .or_else(|_| row.try_get::<f64, _>(column).map(|n| n.to_string()))
            .store()
    };
    Ok(RawEvent {
        sequence: row.try_get("sequence").store()?,
        event_id: event_id(row, "event_id")?,
        aggregate_type: text("aggregate_type")?,
        aggregate_id: text("aggregate_id")?,
        event_type: text("event_type")?,
        partition_key: text("partition_key")?,
        payload: text("payload")?,
        payload_version: row.try_get("payload_version").unwrap_or(-1),
        headers: text("headers")?,
        created_at: time(row, "created_at")?,
        available_at: time(row, "available_at")?,
        attempts: row.try_get("attempts").store()?,
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
