//! Decoding MySQL rows into core types.

use chrono::{DateTime, Utc};
use outbox_core::store::AttemptRecord;
use outbox_core::{EventId, RawEvent, StoreError};
use sqlx::Row;
use sqlx::mysql::MySqlRow;

use crate::error::ResultExt;

/// Times are stored as microseconds since the Unix epoch: integers compare
/// and index exactly, unlike text timestamps of varying precision.
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

/// The columns of [`super::queries::EVENT_COLUMNS`], not yet trusted as an
/// event: decoding is [`RawEvent::decode`], per row.
pub(super) fn raw_event(row: &MySqlRow) -> Result<RawEvent, StoreError> {
    Ok(RawEvent {
        sequence: row.try_get("sequence").store()?,
        event_id: event_id(row, "event_id")?,
        aggregate_type: text(row, "aggregate_type")?,
        aggregate_id: text(row, "aggregate_id")?,
        event_type: text(row, "event_type")?,
        partition_key: text(row, "partition_key")?,
        payload: text(row, "payload")?,
        payload_version: i64::from(row.try_get::<i32, _>("payload_version").store()?),
        headers: text(row, "headers")?,
        created_at: time(row, "created_at")?,
        available_at: time(row, "available_at")?,
        attempts: i64::from(row.try_get::<i32, _>("attempts").store()?),
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
