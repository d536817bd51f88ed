//! Decoding PostgreSQL rows into core types.

use chrono::{DateTime, Utc};
use outbox_core::store::AttemptRecord;
use outbox_core::{EventId, RawEvent, StoreError};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use crate::error::ResultExt;

/// The columns of [`super::queries::EVENT_COLUMNS`], not yet trusted as an
/// event: decoding is [`RawEvent::decode`], per row.
pub(super) fn raw_event(row: &PgRow) -> Result<RawEvent, StoreError> {
    Ok(RawEvent {
        sequence: row.try_get("sequence").store()?,
        event_id: EventId::from_uuid(row.try_get::<Uuid, _>("event_id").store()?),
        aggregate_type: row.try_get("aggregate_type").store()?,
        aggregate_id: row.try_get("aggregate_id").store()?,
        event_type: row.try_get("event_type").store()?,
        partition_key: row.try_get("partition_key").store()?,
        payload: row.try_get("payload").store()?,
        payload_version: i64::from(row.try_get::<i32, _>("payload_version").store()?),
        headers: row.try_get("headers").store()?,
        created_at: row.try_get("created_at").store()?,
        available_at: row.try_get("available_at").store()?,
        attempts: i64::from(row.try_get::<i32, _>("attempts").store()?),
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
