//! Pieces of the admin trait every dialect shares.

use outbox_core::store::{AttemptRecord, OutboxAdmin};
use outbox_core::{EventId, StoreError};

use crate::codes;
use crate::row::Row;

/// Why an operator action (requeue, skip, supersede) matched no row: the
/// event does not exist, or it is not failed-and-not-superseded.
pub async fn explain_miss<A: OutboxAdmin + ?Sized>(admin: &A, event_id: EventId) -> StoreError {
    match admin.event_state(event_id).await {
        Ok(None) => StoreError::NotFound(event_id),
        Ok(Some(state)) => StoreError::WrongState {
            event_id,
            actual: state.name(),
            expected: "failed (not superseded)",
        },
        Err(e) => e,
    }
}

/// An attempt-history row (`kind`, `at`, `actor`, `error_class`, `detail`,
/// `attempts`), as every dialect's history statements return it.
pub fn attempt_record(row: &Row) -> Result<AttemptRecord, StoreError> {
    Ok(AttemptRecord {
        kind: codes::attempt_kind(&row.text("kind")?)?,
        at: row.time("at")?,
        actor: row.text("actor")?,
        error_class: row
            .opt_text("error_class")?
            .as_deref()
            .map(codes::error_class)
            .transpose()?,
        detail: row.text("detail")?,
        attempts: row.int("attempts")? as u32,
    })
}
