//! Pieces of the admin trait every dialect shares.

use outbox_core::store::OutboxAdmin;
use outbox_core::{EventId, StoreError};

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
