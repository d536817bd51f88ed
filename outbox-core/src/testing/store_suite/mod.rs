//! The store suite: the row state machine and ordering on one store.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::fixtures::{event, event_with_payload, events_over_keys};
use super::{BeginWrite, StoreFactory, enqueue_all};
use crate::clock::ManualClock;
use crate::error::StoreError;
use crate::event::{EventId, InvalidEvent, NewEvent};
use crate::policy::{Ordering, PoisonPolicy};
use crate::publisher::ErrorClass;
use crate::store::{
    AttemptKind, ClaimRequest, ClaimedEvent, EnqueueOutcome, EventState, FailReason, Heartbeat,
    HeldBack, Nack, NackAction, OperatorAction, OutboxAdmin, OutboxStore, OutboxWriter,
    PublisherOutage, RelayId, RelayStatus, Release, SettleReport,
};

/// The lease the suite claims with.
pub const LEASE: Duration = Duration::from_secs(10);

/// How much a store on a real clock (the database's, shifted by the test)
/// may run ahead of the test's manual clock while one test runs.
const SLACK: Duration = Duration::from_secs(5);

/// A claim request the suite uses: per-key, `Skip`, crash-loop limit 3.
pub fn request(owner: &str, limit: usize) -> ClaimRequest {
    ClaimRequest {
        owner: RelayId::new(owner),
        limit,
        lease_duration: LEASE,
        ordering: Ordering::PerKey,
        poison: PoisonPolicy::Skip,
        crash_loop_limit: 3,
    }
}

async fn claim(store: &(impl OutboxStore + ?Sized), request: &ClaimRequest) -> Vec<ClaimedEvent> {
    store.claim_batch(request).await.expect("claim").events
}

pub(crate) fn ids(claimed: &[ClaimedEvent]) -> Vec<EventId> {
    claimed.iter().map(|c| c.event.event_id).collect()
}

fn retry(claimed: &ClaimedEvent, after: Duration) -> Nack {
    Nack {
        lease: claimed.lease.clone(),
        action: NackAction::Retry { after },
        error_class: ErrorClass::Transient,
        error: "timed out".into(),
    }
}

fn fail(claimed: &ClaimedEvent, block_key: bool) -> Nack {
    Nack {
        lease: claimed.lease.clone(),
        action: NackAction::Fail {
            reason: FailReason::Permanent,
            block_key,
        },
        error_class: ErrorClass::Permanent,
        error: "message too large".into(),
    }
}

pub(crate) async fn state(store: &(impl OutboxAdmin + ?Sized), id: EventId) -> EventState {
    store
        .event_state(id)
        .await
        .expect("event_state")
        .expect("event exists")
}

/// Asserts that every one of `events` is published.
pub(crate) async fn assert_published(store: &(impl OutboxAdmin + ?Sized), events: &[NewEvent]) {
    for e in events {
        let state = state(store, e.event_id).await;
        assert!(
            matches!(state, EventState::Published { .. }),
            "{} not published: {state:?}",
            e.event_id
        );
    }
}

mod admin;
mod claims;
mod failures;
mod order;

pub use admin::*;
pub use claims::*;
pub use failures::*;
pub use order::*;

/// Claims batches of ten as `r1` and acknowledges each until nothing is
/// left; the events in the order they were claimed.
async fn drain(store: &(impl OutboxStore + ?Sized)) -> Vec<EventId> {
    drain_as(store, &request("r1", 10)).await
}

/// Claims with `request` and acknowledges each batch (every ack applied)
/// until a claim comes back empty; the events in the order they were
/// claimed. Panics if 100,000 batches never empty the outbox.
pub async fn drain_as(store: &(impl OutboxStore + ?Sized), request: &ClaimRequest) -> Vec<EventId> {
    let mut order = Vec::new();
    for _ in 0..100_000 {
        let claimed = claim(store, request).await;
        if claimed.is_empty() {
            return order;
        }
        order.extend(ids(&claimed));
        let report = ack_all(store, &claimed).await;
        assert_eq!(
            report.applied,
            claimed.len(),
            "a fresh batch's acks all apply"
        );
    }
    panic!("the outbox never drained");
}

async fn ack_all(store: &(impl OutboxStore + ?Sized), claimed: &[ClaimedEvent]) -> SettleReport {
    let leases: Vec<_> = claimed.iter().map(|c| c.lease.clone()).collect();
    store.ack(&leases).await.unwrap()
}

trait NowPlus {
    fn now_plus(&self, d: Duration) -> chrono::DateTime<chrono::Utc>;
}
impl NowPlus for ManualClock {
    fn now_plus(&self, d: Duration) -> chrono::DateTime<chrono::Utc> {
        crate::clock::add_duration(crate::Clock::now(self), d)
    }
}
