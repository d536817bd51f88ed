//! The store traits: the small hot-path one, the writer, and maintenance.

use std::time::Duration;

use async_trait::async_trait;

use super::admin::{
    BlockedKey, EventState, EventTypeStats, FailedCount, FailedEvent, FailedPage, HeldBack,
    OperatorAction, RelayStatus,
};
use super::heartbeat::Heartbeat;
use super::history::AttemptRecord;
use super::lease::{
    ClaimRequest, ClaimedBatch, EnqueueOutcome, Lease, Nack, Release, SettleReport,
};
use crate::error::StoreError;
use crate::event::{EventId, NewEvent};

/// What the relay needs from a store: the row state machine.
///
/// Every method is a short transaction of its own; none is held open while
/// publishing.
#[async_trait]
pub trait OutboxStore: Send + Sync {
    /// Leases up to `request.limit` publishable events to `request.owner`.
    ///
    /// With [`crate::Ordering::PerKey`] an event is claimable only when every
    /// earlier event of its key is published or failed without blocking, and
    /// a batch holds a prefix of each key's backlog in order.
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError>;

    /// Marks leased events published. Rows whose token no longer matches are
    /// left alone and reported as fenced.
    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError>;

    /// Records failed attempts: retry later, or fail. Fenced like `ack`.
    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError>;

    /// Returns leases without an outcome; burns no attempt. Fenced like `ack`.
    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError>;

    /// Records that `beat.relay` is alive and whether it is paused by a
    /// publisher outage (see [`OutboxAdmin::relays`]). An outage keeps the
    /// store time it was first recorded at until a beat without one.
    async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError>;
}

/// A shared store is a store: a relay can run over an `Arc` the
/// application also keeps (for its admin reads, or a test's faults).
#[async_trait]
impl<S: OutboxStore + ?Sized> OutboxStore for std::sync::Arc<S> {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        (**self).claim_batch(request).await
    }
    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        (**self).ack(leases).await
    }
    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        (**self).nack(nacks).await
    }
    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        (**self).release(releases).await
    }
    async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        (**self).heartbeat(beat).await
    }
}

/// Enqueue in a transaction of the store's own, committed on return.
///
/// Business code enqueues inside its own transaction through the adapter's
/// `enqueue(&mut tx, ..)`; this trait serves tools, tests and events that
/// have no business change beside them.
#[async_trait]
pub trait OutboxWriter: Send + Sync {
    /// Writes all events atomically, or none if any is invalid. A duplicate
    /// `event_id` is a no-op reported as [`EnqueueOutcome::AlreadyExists`].
    async fn enqueue(&self, events: &[NewEvent]) -> Result<Vec<EnqueueOutcome>, StoreError>;
}

/// Operations and questions for operators.
#[async_trait]
pub trait OutboxAdmin: Send + Sync {
    /// Per event type: claimable count and age of the oldest, parked (backoff
    /// or delay), in-flight and failed counts.
    async fn stats(&self) -> Result<Vec<EventTypeStats>, StoreError>;

    /// What keeps pending events from being published now, if anything:
    /// blocked keys, backoff, expired or long leases, crash suspects, open
    /// transactions. Read together with [`OutboxAdmin::stats`].
    async fn held_back(&self) -> Result<Vec<HeldBack>, StoreError>;

    /// Where one event stands.
    async fn event_state(&self, event_id: EventId) -> Result<Option<EventState>, StoreError>;

    /// Failed events, oldest first, each with its full attempt history.
    async fn failed_events(&self, limit: usize) -> Result<Vec<FailedEvent>, StoreError>;

    /// One page of failed events, oldest first, by type and key: what an
    /// operator pages through. The default reads every failed event and
    /// filters; the SQL stores answer from the failed-events index.
    async fn failed_page(&self, page: &FailedPage) -> Result<Vec<FailedEvent>, StoreError> {
        let all = self.failed_events(usize::MAX).await?;
        Ok(all
            .into_iter()
            .filter(|f| page.admits(f))
            .take(page.limit)
            .collect())
    }

    /// How many failed events `page`'s filters (type, key, after) match
    /// that are not superseded, and the newest one's sequence; the limit
    /// is ignored. The default pages through [`OutboxAdmin::failed_page`];
    /// the SQL stores count from the failed-events indexes.
    async fn count_failed(&self, page: &FailedPage) -> Result<FailedCount, StoreError> {
        let mut count = FailedCount::default();
        let mut next = FailedPage {
            limit: 1_000,
            ..page.clone()
        };
        loop {
            let chunk = self.failed_page(&next).await?;
            for failed in &chunk {
                if failed.superseded_by.is_none() {
                    count.count += 1;
                    count.last_sequence = Some(failed.event.sequence);
                }
            }
            match chunk.last() {
                Some(last) if chunk.len() == next.limit => {
                    next.after_sequence = Some(last.event.sequence);
                }
                _ => return Ok(count),
            }
        }
    }

    /// One failed event with its history; `None` when it has not failed
    /// (or does not exist). The default reads every failed event; the SQL
    /// stores read the one row.
    async fn failed_event(&self, event_id: EventId) -> Result<Option<FailedEvent>, StoreError> {
        let all = self.failed_events(usize::MAX).await?;
        Ok(all.into_iter().find(|f| f.event.event.event_id == event_id))
    }

    /// The append-only history of one event.
    async fn history(&self, event_id: EventId) -> Result<Vec<AttemptRecord>, StoreError>;

    /// Keys parked behind a failed event under `PoisonPolicy::Block`.
    async fn blocked_keys(&self) -> Result<Vec<BlockedKey>, StoreError>;

    /// Moves a failed event back to `pending` with a fresh attempt budget.
    async fn requeue(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError>;

    /// Leaves a failed event failed but stops it blocking its key.
    async fn skip(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError>;

    /// [`OutboxAdmin::requeue`] on each of `event_ids`, in as few
    /// statements as the store can (PostgreSQL: two for the lot, in one
    /// transaction); returns those it requeued. The others were not failed,
    /// were superseded or are gone (`requeue` one to learn which). The
    /// default requeues them one at a time.
    async fn requeue_each(
        &self,
        event_ids: &[EventId],
        action: &OperatorAction,
    ) -> Result<Vec<EventId>, StoreError> {
        one_at_a_time(event_ids, |id| self.requeue(id, action)).await
    }

    /// [`OutboxAdmin::skip`] on each of `event_ids`, as
    /// [`OutboxAdmin::requeue_each`] requeues.
    async fn skip_each(
        &self,
        event_ids: &[EventId],
        action: &OperatorAction,
    ) -> Result<Vec<EventId>, StoreError> {
        one_at_a_time(event_ids, |id| self.skip(id, action)).await
    }

    /// Replaces a failed event by `replacement`, which takes its place in the
    /// key's order; the old event stays failed for audit, linked to the new one.
    async fn supersede(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError>;

    /// Deletes at most `batch_size` events published longer than `older_than`
    /// ago. Never touches unpublished rows. Returns the number deleted; call
    /// again while it returns `batch_size`.
    async fn purge_published(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError>;

    /// The sequence of the newest event written, if the store knows it
    /// (`None` when it is empty or cannot say): how many events were
    /// written between two reads, so an operator's chart can show what was
    /// published meanwhile. Purging old published rows does not lower it
    /// unless the newest row itself was purged.
    async fn last_sequence(&self) -> Result<Option<i64>, StoreError> {
        Ok(None)
    }

    /// Relays and when each last reported alive.
    async fn relays(&self) -> Result<Vec<RelayStatus>, StoreError>;
}

/// An operator action (`act`) on each of `event_ids` in turn: those it
/// applied to. An event it does not apply to (not failed, superseded,
/// gone) is passed over; any other error stops the lot. What
/// [`OutboxAdmin::requeue_each`] and [`OutboxAdmin::skip_each`] do by
/// default, for a store that has no set-based way.
pub async fn one_at_a_time<F, Fut>(
    event_ids: &[EventId],
    mut act: F,
) -> Result<Vec<EventId>, StoreError>
where
    F: FnMut(EventId) -> Fut,
    Fut: std::future::Future<Output = Result<(), StoreError>>,
{
    let mut done = Vec::new();
    for &event_id in event_ids {
        match act(event_id).await {
            Ok(()) => done.push(event_id),
            Err(StoreError::NotFound(_) | StoreError::WrongState { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(done)
}
