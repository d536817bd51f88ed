//! Decoding PostgreSQL rows into core types.

use chrono::{DateTime, Utc};
use outbox_core::store::AttemptRecord;
use outbox_core::{EventId, Headers, NewEvent, StoreError, StoredEvent};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use crate::error::ResultExt;

/// Rebuilds the event from the columns of [`super::queries::EVENT_COLUMNS`].
pub(super) fn stored_event(row: &PgRow) -> Result<StoredEvent, StoreError> {
    let headers: String = row.try_get("headers").store()?;
    let headers: Headers = serde_json::from_str(&headers).map_err(StoreError::fatal)?;
    let payload: String = row.try_get("payload").store()?;
    let payload_version: i32 = row.try_get("payload_version").store()?;
    let attempts: i32 = row.try_get("attempts").store()?;
    let event = NewEvent::builder(
        row.try_get::<String, _>("event_type").store()?,
        row.try_get::<String, _>("aggregate_type").store()?,
        row.try_get::<String, _>("aggregate_id").store()?,
    )
    .event_id(EventId::from_uuid(
        row.try_get::<Uuid, _>("event_id").store()?,
    ))
    .partition_key(row.try_get::<String, _>("partition_key").store()?)
    .payload_json(payload)
    .payload_version(payload_version as u32)
    .headers(headers)
    .build()
    .map_err(|e| StoreError::fatal(format!("stored event does not decode: {e}")))?;
    Ok(StoredEvent {
        sequence: row.try_get("sequence").store()?,
        event,
        created_at: row.try_get("created_at").store()?,
        available_at: row.try_get("available_at").store()?,
        attempts: attempts as u32,
    })
}

pub(super) fn attempt_record(row: &PgRow) -> Result<(EventId, AttemptRecord), StoreError> {
    let kind: String = row.try_get("kind").store()?;
    let error_class: Option<String> = row.try_get("error_class").store()?;
    let attempts: i32 = row.try_get("attempts").store()?;
    let at: DateTime<Utc> = row.try_get("at").store()?;
    Ok((
        EventId::from_uuid(row.try_get::<Uuid, _>("event_id").store()?),
        AttemptRecord {
            kind: crate::codes::attempt_kind(&kind)?,
            at,
            actor: row.try_get("actor").store()?,
            error_class: error_class
                .as_deref()
                .map(crate::codes::error_class)
                .transpose()?,
            detail: row.try_get("detail").store()?,
            attempts: attempts as u32,
        },
    ))
}
