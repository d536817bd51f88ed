//! The store suite: the row state machine and ordering on one store.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::fixtures::{event, event_with_payload, events_over_keys};
use super::{BeginWrite, StoreFactory, enqueue_all};
use crate::clock::ManualClock;
use crate::error::StoreError;
use crate::event::{EventId, InvalidEvent};
use crate::policy::{Ordering, PoisonPolicy};
use crate::publisher::ErrorClass;
use crate::store::{
    AttemptKind, ClaimRequest, ClaimedEvent, EnqueueOutcome, EventState, FailReason, Heartbeat,
    HeldBack, Nack, NackAction, OperatorAction, OutboxAdmin, OutboxStore, OutboxWriter,
    PublisherOutage, RelayId, RelayStatus, Release,
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

fn ids(claimed: &[ClaimedEvent]) -> Vec<EventId> {
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

async fn state(store: &(impl OutboxAdmin + ?Sized), id: EventId) -> EventState {
    store
        .event_state(id)
        .await
        .expect("event_state")
        .expect("event exists")
}

/// Enqueueing an existing `event_id` writes nothing and says so.
pub async fn duplicate_enqueue_is_reported_noop<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let e = event("a", 1);
    let first = store.enqueue(std::slice::from_ref(&e)).await.unwrap();
    assert!(matches!(first[0], EnqueueOutcome::Inserted { .. }));
    let mut replay = event("a", 99);
    replay.event_id = e.event_id;
    let second = store.enqueue(&[replay, event("a", 2)]).await.unwrap();
    assert_eq!(second[0], EnqueueOutcome::AlreadyExists);
    assert!(matches!(second[1], EnqueueOutcome::Inserted { .. }));
    let claimed = claim(&*store, &request("r1", 10)).await;
    assert_eq!(claimed.len(), 2, "the duplicate must not add a row");
    // Compared as JSON values: a store may normalise the text (jsonb does).
    let stored: serde_json::Value = claimed[0].event.payload.deserialize().unwrap();
    let original: serde_json::Value = e.payload.deserialize().unwrap();
    assert_eq!(stored, original, "the original row is untouched");
}

/// Bad input is refused with a typed error and nothing of the batch is written.
pub async fn invalid_events_are_refused_atomically<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let huge = "x".repeat(2 * 1024 * 1024);
    let oversized = event_with_payload("a", 1, serde_json::json!({ "blob": huge }));
    let err = store
        .enqueue(&[event("a", 0), oversized])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidEvent(InvalidEvent::PayloadTooLarge { .. })
        ),
        "got {err:?}"
    );
    assert!(!err.is_retryable());
    let mut empty_type = event("a", 2);
    empty_type.event_type = String::new();
    let err = store.enqueue(&[empty_type]).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidEvent(InvalidEvent::EmptyField("event_type"))
        ),
        "got {err:?}"
    );
    let mut long_key = event("a", 3);
    long_key.partition_key = "k".repeat(10_000);
    let err = store.enqueue(&[long_key]).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidEvent(InvalidEvent::FieldTooLong { .. })
        ),
        "got {err:?}"
    );
    assert!(
        claim(&*store, &request("r1", 10)).await.is_empty(),
        "nothing of a refused batch is written"
    );
}

/// Concurrent claimers never receive the same event.
pub async fn claims_are_exclusive_under_concurrency<F: StoreFactory>(factory: &F) {
    for ordering in [Ordering::Unordered, Ordering::PerKey] {
        let store = factory.create(ManualClock::at_epoch()).await;
        let events = events_over_keys(300, 300);
        enqueue_all(&*store, &events).await;
        let mut tasks = Vec::new();
        for r in 0..8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut request = request(&format!("r{r}"), 7);
                request.ordering = ordering;
                let mut mine = Vec::new();
                loop {
                    let batch = claim(&*store, &request).await;
                    if batch.is_empty() {
                        return mine;
                    }
                    mine.extend(ids(&batch));
                    tokio::task::yield_now().await;
                }
            }));
        }
        let mut seen = HashSet::new();
        for task in tasks {
            for id in task.await.unwrap() {
                assert!(seen.insert(id), "{id} claimed twice ({ordering:?})");
            }
        }
        assert_eq!(
            seen.len(),
            events.len(),
            "every event claimed once ({ordering:?})"
        );
    }
}

/// A batch holds a prefix of each key in order; nothing of a key whose head
/// is leased is handed to another claimer.
pub async fn per_key_claims_are_ordered_prefixes<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let (a1, a2, a3, b1) = (event("a", 1), event("a", 2), event("a", 3), event("b", 1));
    enqueue_all(&*store, &[a1.clone(), a2.clone(), a3.clone(), b1.clone()]).await;
    let first = claim(&*store, &request("r1", 1)).await;
    assert_eq!(ids(&first), vec![a1.event_id], "the oldest head first");
    let second = claim(&*store, &request("r2", 10)).await;
    assert_eq!(ids(&second), vec![b1.event_id], "key a is held by r1");
    store.ack(&[first[0].lease.clone()]).await.unwrap();
    let third = claim(&*store, &request("r2", 10)).await;
    assert_eq!(
        ids(&third),
        vec![a2.event_id, a3.event_id],
        "the rest of key a, in order"
    );
    assert!(third[0].lease.sequence < third[1].lease.sequence);
}

/// An expired lease makes its event claimable again, under a new token.
pub async fn lease_expiry_makes_events_claimable_again<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let first = claim(&*store, &request("r1", 10)).await;
    assert_eq!(first.len(), 1);
    assert!(claim(&*store, &request("r2", 10)).await.is_empty());
    clock.advance(LEASE - Duration::from_secs(1));
    assert!(
        claim(&*store, &request("r2", 10)).await.is_empty(),
        "lease still valid"
    );
    clock.advance(Duration::from_secs(2));
    let second = claim(&*store, &request("r2", 10)).await;
    assert_eq!(ids(&second), vec![e.event_id]);
    assert!(second[0].lease.fencing_token > first[0].lease.fencing_token);
    assert!(
        matches!(state(&*store, e.event_id).await, EventState::InFlight { owner, .. } if owner == "r2")
    );
}

/// A relay that dies (or pauses past its lease) holding a batch over many
/// keys: once the lease has expired, the next claim takes the whole batch
/// back, so its keys resume after one lease, not one per claim. If that
/// lease dies too, the rows go back in halves (a poison event among them is
/// being looked for); nobody is blamed and nothing fails.
pub async fn a_dead_relays_keys_come_back_in_one_claim<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let events = events_over_keys(40, 40);
    enqueue_all(&*store, &events).await;
    let expected: HashSet<EventId> = events.iter().map(|e| e.event_id).collect();
    let dead = claim(&*store, &request("r-dead", 40)).await;
    assert_eq!(dead.len(), 40);
    clock.advance(LEASE + Duration::from_secs(1));
    let back = claim(&*store, &request("r-next", 100)).await;
    assert_eq!(
        ids(&back).into_iter().collect::<HashSet<_>>(),
        expected,
        "the dead relay's 40 keys come back in one claim, not one per claim"
    );
    // That relay dies as well: the 40 crashed twice together, and go back
    // 20 at a time.
    clock.advance(LEASE + Duration::from_secs(1));
    let first_half = claim(&*store, &request("r-third", 100)).await;
    assert_eq!(first_half.len(), 20, "{:?}", ids(&first_half));
    let second_half = claim(&*store, &request("r-fourth", 100)).await;
    assert_eq!(second_half.len(), 20, "{:?}", ids(&second_half));
    let leases: Vec<_> = first_half
        .iter()
        .chain(&second_half)
        .map(|c| c.lease.clone())
        .collect();
    assert_eq!(store.ack(&leases).await.unwrap().applied, 40);
    assert!(store.failed_events(10).await.unwrap().is_empty());
    for e in &events {
        assert!(
            matches!(
                state(&*store, e.event_id).await,
                EventState::Published { .. }
            ),
            "{} not published",
            e.event_id
        );
    }
}

/// A hot key's backlog costs only that key: while one relay holds the head
/// of a key with 1,000 events waiting behind it, another relay's claims
/// reach the events other keys committed after the burst within a few
/// claims (never waiting for the burst to drain), and the hot key goes on
/// in order afterwards.
pub async fn a_hot_keys_backlog_holds_no_other_key<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let hot: Vec<_> = (0..1000).map(|n| event("hot", n)).collect();
    for burst in hot.chunks(250) {
        enqueue_all(&*store, burst).await;
    }
    let head = claim(&*store, &request("r-hot", 100)).await;
    assert_eq!(
        ids(&head),
        ids_of(&hot[..100]),
        "the hot key's head, in order"
    );
    // Other keys commit after the burst: behind it in commit order.
    let cold: Vec<_> = (0..5).map(|k| event(&format!("cold-{k}"), 0)).collect();
    enqueue_all(&*store, &cold).await;

    let mut reached = HashSet::new();
    for _ in 0..4 {
        let batch = claim(&*store, &request("r-other", 100)).await;
        assert!(
            batch.iter().all(|c| c.event.partition_key != "hot"),
            "the hot key is in flight"
        );
        reached.extend(ids(&batch));
        if reached.len() == cold.len() {
            break;
        }
    }
    assert_eq!(
        reached,
        cold.iter().map(|e| e.event_id).collect::<HashSet<_>>(),
        "the other keys' events within four claims, behind a 900-event backlog of one key"
    );

    store
        .ack(&head.iter().map(|c| c.lease.clone()).collect::<Vec<_>>())
        .await
        .unwrap();
    let next = claim(&*store, &request("r-hot", 100)).await;
    assert_eq!(
        ids(&next),
        ids_of(&hot[100..200]),
        "the hot key goes on in order"
    );
}

fn ids_of(events: &[crate::event::NewEvent]) -> Vec<EventId> {
    events.iter().map(|e| e.event_id).collect()
}

/// A relay that lost its lease cannot settle over the newer claim.
pub async fn stale_settlements_are_fenced<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let stale = claim(&*store, &request("r1", 10)).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let fresh = claim(&*store, &request("r2", 10)).await;
    assert_eq!(fresh.len(), 1);

    let report = store.ack(&[stale[0].lease.clone()]).await.unwrap();
    assert_eq!(
        (report.applied, report.fenced.clone()),
        (0, vec![e.event_id])
    );
    let report = store.nack(&[fail(&stale[0], true)]).await.unwrap();
    assert_eq!(report.fenced, vec![e.event_id]);
    let report = store
        .release(&[Release {
            lease: stale[0].lease.clone(),
            attempt_started: false,
        }])
        .await
        .unwrap();
    assert_eq!(report.fenced, vec![e.event_id]);
    assert!(
        matches!(state(&*store, e.event_id).await, EventState::InFlight { owner, .. } if owner == "r2")
    );

    let report = store.ack(&[fresh[0].lease.clone()]).await.unwrap();
    assert_eq!(report.applied, 1);
    assert!(report.fenced.is_empty());
    assert!(matches!(
        state(&*store, e.event_id).await,
        EventState::Published { .. }
    ));
    let again = store.ack(&[fresh[0].lease.clone()]).await.unwrap();
    assert_eq!(
        again.fenced,
        vec![e.event_id],
        "a settled lease cannot settle twice"
    );
}

/// A retried event waits for its `available_at`, and holds its key back meanwhile.
pub async fn backoff_honours_available_at<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let (a1, a2, b1) = (event("a", 1), event("a", 2), event("b", 1));
    enqueue_all(&*store, &[a1.clone(), a2.clone()]).await;
    let first = claim(&*store, &request("r1", 1)).await;
    store
        .nack(&[retry(&first[0], Duration::from_secs(30))])
        .await
        .unwrap();
    enqueue_all(&*store, std::slice::from_ref(&b1)).await;
    let during = claim(&*store, &request("r1", 10)).await;
    assert_eq!(
        ids(&during),
        vec![b1.event_id],
        "a2 must wait behind a1's backoff"
    );
    store.ack(&[during[0].lease.clone()]).await.unwrap();
    clock.advance(Duration::from_secs(29));
    assert!(claim(&*store, &request("r1", 10)).await.is_empty());
    clock.advance(Duration::from_secs(2));
    let after = claim(&*store, &request("r1", 10)).await;
    assert_eq!(ids(&after), vec![a1.event_id, a2.event_id]);
    assert_eq!(after[0].event.attempts, 1);
    let history = store.history(a1.event_id).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].kind, AttemptKind::TransientFailure);
    assert_eq!(history[0].error_class, Some(ErrorClass::Transient));
    assert_eq!(history[0].actor, "r1");
}

/// A delayed event is not claimed before its `available_at`.
pub async fn delayed_events_wait<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let mut delayed = event("a", 1);
    delayed.available_at = Some(clock.now_plus(Duration::from_secs(60)));
    enqueue_all(&*store, &[delayed]).await;
    assert!(claim(&*store, &request("r1", 10)).await.is_empty());
    let stats = store.stats().await.unwrap();
    assert_eq!((stats[0].claimable, stats[0].parked), (0, 1));
    clock.advance(Duration::from_secs(61));
    assert_eq!(claim(&*store, &request("r1", 10)).await.len(), 1);
}

/// `Skip`: a failed event does not hold its key back.
pub async fn skip_policy_lets_the_key_continue<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let (a1, a2) = (event("a", 1), event("a", 2));
    enqueue_all(&*store, &[a1.clone(), a2.clone()]).await;
    let first = claim(&*store, &request("r1", 1)).await;
    store.nack(&[fail(&first[0], false)]).await.unwrap();
    assert_eq!(
        ids(&claim(&*store, &request("r1", 10)).await),
        vec![a2.event_id]
    );
    assert!(store.blocked_keys().await.unwrap().is_empty());
    let failed = store.failed_events(10).await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].history[0].kind, AttemptKind::PermanentFailure);
}

/// `Block`: a failed event parks its key and backlog until an operator acts;
/// other keys flow.
pub async fn block_policy_parks_the_key_until_an_operator_acts<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let (a1, a2, a3, b1) = (event("a", 1), event("a", 2), event("a", 3), event("b", 1));
    enqueue_all(&*store, &[a1.clone(), a2.clone(), a3.clone(), b1.clone()]).await;
    let first = claim(&*store, &request("r1", 1)).await;
    assert_eq!(ids(&first), vec![a1.event_id]);
    store.nack(&[fail(&first[0], true)]).await.unwrap();
    assert_eq!(
        ids(&claim(&*store, &request("r1", 10)).await),
        vec![b1.event_id]
    );
    let blocked = store.blocked_keys().await.unwrap();
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].partition_key, "a");
    assert_eq!(blocked[0].blocking_event_id, a1.event_id);
    assert_eq!(blocked[0].backlog, 2);

    let op = OperatorAction::new("alice", "payload fixed downstream");
    store.skip(a1.event_id, &op).await.unwrap();
    assert!(store.blocked_keys().await.unwrap().is_empty());
    assert_eq!(
        ids(&claim(&*store, &request("r1", 10)).await),
        vec![a2.event_id, a3.event_id]
    );
    let history = store.history(a1.event_id).await.unwrap();
    assert_eq!(history.last().unwrap().kind, AttemptKind::Skipped);
    assert_eq!(history.last().unwrap().actor, "alice");
    assert!(matches!(
        state(&*store, a1.event_id).await,
        EventState::Failed {
            blocks_key: false,
            ..
        }
    ));
}

/// Requeue moves a failed event back with a fresh budget; history is only
/// appended to.
pub async fn requeue_appends_history<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let c = claim(&*store, &request("r1", 1)).await;
    store.nack(&[retry(&c[0], Duration::ZERO)]).await.unwrap();
    let c = claim(&*store, &request("r1", 1)).await;
    store.nack(&[fail(&c[0], true)]).await.unwrap();
    let before = store.history(e.event_id).await.unwrap();
    assert_eq!(before.len(), 2);

    let op = OperatorAction::new("bob", "topic created");
    store.requeue(e.event_id, &op).await.unwrap();
    let after = store.history(e.event_id).await.unwrap();
    assert_eq!(after.len(), 3);
    assert_eq!(
        &after[..2],
        &before[..],
        "earlier entries are never rewritten"
    );
    assert_eq!(after[2].kind, AttemptKind::Requeued);
    assert_eq!(
        (after[2].actor.as_str(), after[2].detail.as_str()),
        ("bob", "topic created")
    );
    let again = claim(&*store, &request("r1", 1)).await;
    assert_eq!(ids(&again), vec![e.event_id]);
    assert_eq!(
        again[0].event.attempts, 0,
        "requeue restores the attempt budget"
    );

    let err = store.requeue(e.event_id, &op).await.unwrap_err();
    assert!(
        matches!(err, StoreError::WrongState { .. }),
        "only failed events can be requeued: {err:?}"
    );
    let err = store.requeue(EventId::random(), &op).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)));
}

/// A replacement takes the failed event's place in its key's order; the old
/// event stays, linked, for audit.
pub async fn supersede_takes_the_place_of_the_failed_event<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let (a1, a2) = (event("a", 1), event("a", 2));
    enqueue_all(&*store, &[a1.clone(), a2.clone()]).await;
    let c = claim(&*store, &request("r1", 1)).await;
    store.nack(&[fail(&c[0], true)]).await.unwrap();
    let fixed = event_with_payload("a", 1, serde_json::json!({ "fixed": true }));
    let op = OperatorAction::new("carol", "corrected amount");
    let outcome = store
        .supersede(a1.event_id, fixed.clone(), &op)
        .await
        .unwrap();
    assert!(matches!(outcome, EnqueueOutcome::Inserted { .. }));
    // Drain the key, acknowledging as we go: a store may lease the
    // replacement alone and release the backlog only once it is published.
    let mut order = Vec::new();
    loop {
        let claimed = claim(&*store, &request("r1", 10)).await;
        if claimed.is_empty() {
            break;
        }
        order.extend(ids(&claimed));
        let leases: Vec<_> = claimed.iter().map(|c| c.lease.clone()).collect();
        store.ack(&leases).await.unwrap();
    }
    assert_eq!(
        order,
        vec![fixed.event_id, a2.event_id],
        "replacement before the backlog"
    );
    assert!(matches!(
        state(&*store, a1.event_id).await,
        EventState::Failed { superseded_by: Some(id), .. } if id == fixed.event_id
    ));
    assert_eq!(
        store
            .history(a1.event_id)
            .await
            .unwrap()
            .last()
            .unwrap()
            .kind,
        AttemptKind::Superseded
    );
}

/// Claims that never reach an outcome end in `failed` after the bound.
pub async fn crash_loops_end_in_failed<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let (a1, a2) = (event("a", 1), event("a", 2));
    enqueue_all(&*store, &[a1.clone(), a2.clone()]).await;
    let req = request("r1", 1);
    for _ in 0..req.crash_loop_limit {
        let c = store.claim_batch(&req).await.unwrap();
        assert_eq!(ids(&c.events), vec![a1.event_id]);
        assert!(c.crash_looped.is_empty());
        clock.advance(LEASE + Duration::from_secs(1)); // the relay died mid-publish
    }
    let c = store.claim_batch(&req).await.unwrap();
    assert_eq!(
        c.crash_looped
            .iter()
            .map(|e| e.event_id)
            .collect::<Vec<_>>(),
        vec![a1.event_id]
    );
    assert_eq!(
        ids(&c.events),
        vec![a2.event_id],
        "under Skip the key continues"
    );
    assert!(matches!(
        state(&*store, a1.event_id).await,
        EventState::Failed { .. }
    ));
    let history = store.history(a1.event_id).await.unwrap();
    assert_eq!(history.last().unwrap().kind, AttemptKind::CrashLoop);
}

/// Releasing burns no attempt and does not count towards crash loops.
pub async fn release_burns_no_attempt<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let req = request("r1", 1);
    for _ in 0..(req.crash_loop_limit * 3) {
        let c = store.claim_batch(&req).await.unwrap();
        assert_eq!(ids(&c.events), vec![e.event_id]);
        let released = store
            .release(&[Release {
                lease: c.events[0].lease.clone(),
                attempt_started: false,
            }])
            .await
            .unwrap();
        assert_eq!(released.applied, 1);
    }
    let c = claim(&*store, &req).await;
    assert_eq!(c[0].event.attempts, 0);
    assert!(store.history(e.event_id).await.unwrap().is_empty());
}

/// Purge deletes only published rows older than the cut-off, in bounded batches.
pub async fn purge_never_touches_unpublished_rows<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let events = events_over_keys(12, 12);
    enqueue_all(&*store, &events).await;
    let claimed = claim(&*store, &request("r1", 12)).await;
    store
        .ack(
            &claimed[..5]
                .iter()
                .map(|c| c.lease.clone())
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    store
        .nack(&[fail(&claimed[5], false), fail(&claimed[6], true)])
        .await
        .unwrap();
    store
        .nack(&[retry(&claimed[7], Duration::from_secs(1))])
        .await
        .unwrap();
    store
        .release(&[Release {
            lease: claimed[8].lease.clone(),
            attempt_started: false,
        }])
        .await
        .unwrap();
    // claimed[9..] stay in flight; events published now are too young to purge.
    assert_eq!(
        store
            .purge_published(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    clock.advance(Duration::from_secs(7200));
    let mut purged = 0;
    loop {
        let n = store
            .purge_published(Duration::from_secs(3600), 2)
            .await
            .unwrap();
        assert!(n <= 2, "a purge batch is bounded");
        if n == 0 {
            break;
        }
        purged += n;
    }
    assert_eq!(purged, 5);
    for c in &claimed[..5] {
        assert_eq!(store.event_state(c.event.event_id).await.unwrap(), None);
    }
    for c in &claimed[5..] {
        assert!(
            store.event_state(c.event.event_id).await.unwrap().is_some(),
            "unpublished row purged"
        );
    }
}

/// Purge keeps its contract however the history was made: a call returns
/// fewer than `batch_size` only when nothing the cut-off allows is left, so
/// "call again while it returns `batch_size`" empties the history. Events
/// are published one per claim (on PostgreSQL each is a claim-order run of
/// its own, the shape live traffic leaves), some after a retry (written
/// published), and the batch is larger than any internal read.
pub async fn purge_empties_the_history_while_it_returns_batch_size<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let req = request("r1", 16);
    let mut published = Vec::new();
    for n in 0..300usize {
        let e = event(&format!("k{}", n % 7), n);
        enqueue_all(&*store, std::slice::from_ref(&e)).await;
        let mut c = claim(&*store, &req).await;
        if n % 10 == 0 {
            // A retry first: the row leaves claim order and is written
            // published when acked.
            store.nack(&[retry(&c[0], Duration::ZERO)]).await.unwrap();
            c = claim(&*store, &req).await;
        }
        store.ack(&[c[0].lease.clone()]).await.unwrap();
        published.push(e.event_id);
    }
    let pending = event("late", 1);
    enqueue_all(&*store, std::slice::from_ref(&pending)).await;
    clock.advance(Duration::from_secs(7200));
    let (mut purged, mut calls) = (0, 0);
    loop {
        let n = store
            .purge_published(Duration::from_secs(3600), 100)
            .await
            .unwrap();
        assert!(n <= 100, "a purge batch is bounded: {n}");
        purged += n;
        calls += 1;
        if n < 100 {
            break;
        }
    }
    assert_eq!(
        purged,
        300,
        "the documented loop stopped after {calls} calls with {} published events left",
        300 - purged
    );
    for id in published {
        assert_eq!(
            store.event_state(id).await.unwrap(),
            None,
            "{id} not purged"
        );
    }
    assert!(store.event_state(pending.event_id).await.unwrap().is_some());
}

/// Stats count claimable events and the age of the oldest, parked apart.
pub async fn stats_report_lag_and_parked_events<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let mut refund = event("b", 9);
    refund.event_type = "invoice.refunded".into();
    enqueue_all(
        &*store,
        &[event("a", 1), event("a", 2), event("c", 3), refund],
    )
    .await;
    clock.advance(Duration::from_secs(5));
    let c = claim(&*store, &request("r1", 1)).await;
    store
        .nack(&[retry(&c[0], Duration::from_secs(60))])
        .await
        .unwrap();
    let _in_flight = claim(&*store, &request("r2", 1)).await;
    let stats: HashMap<String, _> = store
        .stats()
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.event_type.clone(), s))
        .collect();
    let paid = &stats["invoice.paid"];
    assert_eq!(
        (paid.claimable, paid.parked, paid.in_flight, paid.failed),
        (1, 1, 1, 0),
        "{paid:?}"
    );
    // Store time: a database clock also moved while the test ran.
    let age = paid.oldest_claimable_age.expect("an age");
    assert!(
        age >= Duration::from_secs(5) && age < Duration::from_secs(5) + SLACK,
        "{age:?}"
    );
    let refunded = &stats["invoice.refunded"];
    assert_eq!(
        (refunded.claimable, refunded.in_flight),
        (1, 0),
        "{refunded:?}"
    );
}

/// `stats`, `held_back` and `blocked_keys` agree with each other and with
/// the rows, in every situation at once: a key blocked by a failed event
/// with events behind it (blocked: neither claimable nor in the lag), a
/// key in retry backoff and one delayed (parked, the due events behind
/// them counted claimable and as waiting on the backoff), a key with a
/// batch in flight, and a free key.
pub async fn status_adds_up<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let (b1, r1, f1) = (event("blk", 1), event("retry", 1), event("fly", 1));
    enqueue_all(&*store, &[b1.clone(), r1.clone(), f1.clone()]).await;
    let mut blocking = request("r1", 10);
    blocking.poison = PoisonPolicy::Block;
    let first = claim(&*store, &blocking).await;
    assert_eq!(first.len(), 3);
    let of = |id: EventId| first.iter().find(|c| c.event.event_id == id).unwrap();
    store
        .nack(&[
            fail(of(b1.event_id), true),
            retry(of(r1.event_id), Duration::from_secs(60)),
        ])
        .await
        .unwrap();
    // f1 stays in flight.
    let mut blocked_type = event("blk", 2);
    blocked_type.event_type = "invoice.voided".into();
    let mut delayed = event("delay", 1);
    delayed.available_at = Some(clock.now_plus(Duration::from_secs(120)));
    let behind = [
        blocked_type,
        event("blk", 3),
        event("retry", 2),
        event("fly", 2),
        delayed,
        event("delay", 2),
        event("free", 1),
    ];
    enqueue_all(&*store, &behind).await;
    clock.advance(Duration::from_secs(5));

    let stats = store.stats().await.unwrap();
    let total = |f: fn(&crate::store::EventTypeStats) -> u64| stats.iter().map(f).sum::<u64>();
    assert_eq!(
        (
            total(|s| s.claimable),
            total(|s| s.parked),
            total(|s| s.blocked),
            total(|s| s.in_flight),
            total(|s| s.failed)
        ),
        // claimable: retry 2, fly 2, delay 2, free 1; parked: retry 1,
        // delay 1; blocked: blk 2 (voided) and blk 3; in flight: fly 1;
        // failed: blk 1.
        (4, 2, 2, 1, 1),
        "{stats:?}"
    );
    let voided = stats
        .iter()
        .find(|s| s.event_type == "invoice.voided")
        .expect("a row per type");
    assert_eq!(
        (
            voided.claimable,
            voided.blocked,
            voided.oldest_claimable_age
        ),
        (0, 1, None),
        "a blocked event is not claimable and not lag: {voided:?}"
    );
    let age = stats
        .iter()
        .find(|s| s.event_type == "invoice.paid")
        .and_then(|s| s.oldest_claimable_age)
        .expect("claimable events have an age");
    assert!(
        age >= Duration::from_secs(5) && age < Duration::from_secs(5) + SLACK,
        "{age:?}"
    );

    let blocked = store.blocked_keys().await.unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(
        (
            blocked[0].partition_key.as_str(),
            blocked[0].blocking_event_id,
            blocked[0].backlog
        ),
        ("blk", b1.event_id, 2)
    );
    let held = store.held_back().await.unwrap();
    let blocked_keys = held.iter().find_map(|h| match h {
        HeldBack::BlockedKeys { keys, waiting } => Some((*keys, *waiting)),
        _ => None,
    });
    assert_eq!(blocked_keys, Some((1, 2)), "{held:?}");
    let backing_off = held.iter().find_map(|h| match h {
        HeldBack::BackingOff {
            keys,
            waiting,
            next_due,
        } => Some((*keys, *waiting, *next_due)),
        _ => None,
    });
    let (keys, waiting, next_due) = backing_off.unwrap_or_else(|| panic!("{held:?}"));
    // retry 1 and 2, delay 1 and 2; the retry comes due first (55 s).
    assert_eq!((keys, waiting), (2, 4), "{held:?}");
    // Store time now, as the store reads it: a heartbeat's.
    store
        .heartbeat(&Heartbeat::alive(RelayId::new("clock")))
        .await
        .unwrap();
    let now = status_of(&*store, "clock").await.last_seen;
    let until = (next_due - now).to_std().expect("due later");
    assert!(
        until > Duration::from_secs(50) && until <= Duration::from_secs(55),
        "{until:?}"
    );
    assert!(
        !held.iter().any(|h| matches!(
            h,
            HeldBack::OpenTransactions { .. }
                | HeldBack::ExpiredLeases { .. }
                | HeldBack::CrashSuspects { .. }
        )),
        "nothing else holds anything: {held:?}"
    );
    // What a claim takes now: the free key only (the others wait on a
    // failed event, a backoff, a delay or the batch in flight).
    assert_eq!(
        claim(&*store, &blocking)
            .await
            .iter()
            .map(|c| c.event.partition_key.as_str())
            .collect::<Vec<_>>(),
        vec!["free"]
    );
}

/// Heartbeats make relays visible with their last-seen time.
pub async fn heartbeats_report_liveness<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    store
        .heartbeat(&Heartbeat::alive(RelayId::new("r1")))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(3));
    store
        .heartbeat(&Heartbeat::alive(RelayId::new("r2")))
        .await
        .unwrap();
    let mut relays = store.relays().await.unwrap();
    relays.sort_by(|a, b| a.relay.cmp(&b.relay));
    assert_eq!(relays.len(), 2);
    let between = (relays[1].last_seen - relays[0].last_seen)
        .to_std()
        .expect("r2 seen after r1");
    assert!(
        between >= Duration::from_secs(3) && between < Duration::from_secs(3) + SLACK,
        "{between:?}"
    );
    assert!(relays.iter().all(|r| r.outage.is_none()), "{relays:?}");
}

/// A relay paused by a publisher outage says so in its heartbeat: the
/// store keeps the destination, the latest reason and when the outage was
/// first recorded, until a beat without one clears it; other relays are
/// untouched.
pub async fn heartbeats_record_publisher_outages<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let relay = RelayId::new("paused");
    let outage = |reason: &str| {
        Heartbeat::in_outage(
            relay.clone(),
            PublisherOutage::new("redis 127.0.0.1:6379 streams outbox:<event type>", reason),
        )
    };
    store
        .heartbeat(&Heartbeat::alive(RelayId::new("fine")))
        .await
        .unwrap();
    store
        .heartbeat(&Heartbeat::alive(relay.clone()))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(10));
    store.heartbeat(&outage("WRONGTYPE")).await.unwrap();
    let began = status_of(&*store, "paused")
        .await
        .outage
        .expect("outage recorded");
    assert_eq!(began.reason, "WRONGTYPE");
    assert_eq!(
        began.destination,
        "redis 127.0.0.1:6379 streams outbox:<event type>"
    );
    clock.advance(Duration::from_secs(30));
    // A quote, a long reason in another script: kept as given, cut where
    // the type says.
    let long = format!("it's down: {}", "é".repeat(3000));
    store.heartbeat(&outage(&long)).await.unwrap();
    let later = status_of(&*store, "paused").await;
    let still = later.outage.clone().expect("still in outage");
    assert_eq!(still.since, began.since, "the outage keeps its start");
    assert_eq!(still.reason, PublisherOutage::new("", long).reason);
    assert!(later.last_seen - still.since >= chrono::Duration::seconds(30));
    assert!(status_of(&*store, "fine").await.outage.is_none());
    store
        .heartbeat(&Heartbeat::alive(relay.clone()))
        .await
        .unwrap();
    assert!(
        status_of(&*store, "paused").await.outage.is_none(),
        "cleared"
    );
    // A new outage starts a new clock.
    clock.advance(Duration::from_secs(5));
    store.heartbeat(&outage("refused")).await.unwrap();
    let again = status_of(&*store, "paused")
        .await
        .outage
        .expect("outage again");
    assert!(again.since > still.since);
}

async fn status_of<S: OutboxAdmin + ?Sized>(store: &S, relay: &str) -> RelayStatus {
    store
        .relays()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.relay == relay)
        .unwrap_or_else(|| panic!("relay {relay} listed"))
}

/// A transaction that commits late is never skipped: its event is
/// published once it commits, whatever was published meanwhile (the
/// visibility race that makes naive relays lose events).
pub async fn late_committers_are_never_skipped<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: BeginWrite,
{
    let store = factory.create(ManualClock::at_epoch()).await;
    // Two keys: stores that make writers of one key take turns (MySQL)
    // would otherwise wait here for the first commit.
    let (first, second) = (event("a", 1), event("b", 2));
    let mut early = store.begin_write().await.unwrap();
    early.enqueue(first.clone()).await.unwrap();
    let mut late = store.begin_write().await.unwrap();
    late.enqueue(second.clone()).await.unwrap();
    late.commit().await.unwrap();
    // The two transactions overlap, so either order is fine; the store may
    // also wait for the open one.
    let mut published = Vec::new();
    let claimed = claim(&*store, &request("r1", 10)).await;
    assert!(
        !ids(&claimed).contains(&first.event_id),
        "an uncommitted event was claimed"
    );
    published.extend(ids(&claimed));
    ack_all(&*store, &claimed).await;
    early.commit().await.unwrap();
    loop {
        let claimed = claim(&*store, &request("r1", 10)).await;
        if claimed.is_empty() {
            break;
        }
        published.extend(ids(&claimed));
        ack_all(&*store, &claimed).await;
    }
    published.sort();
    let mut expected = vec![first.event_id, second.event_id];
    expected.sort();
    assert_eq!(published, expected, "both published, once each");
}

/// Order means commit order: a transaction that did its
/// business write first but enqueued after another transaction committed
/// publishes after that one, whatever the store numbers transactions by.
pub async fn order_is_commit_order<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: BeginWrite,
{
    let store = factory.create(ManualClock::at_epoch()).await;
    let (business_first, quick) = (event("s", 1), event("s", 2));
    let mut slow = store.begin_write().await.unwrap();
    slow.write_business_row().await.unwrap();
    let mut fast = store.begin_write().await.unwrap();
    fast.enqueue(quick.clone()).await.unwrap();
    fast.commit().await.unwrap();
    slow.enqueue(business_first.clone()).await.unwrap();
    slow.commit().await.unwrap();
    let mut order = Vec::new();
    loop {
        let claimed = claim(&*store, &request("r1", 10)).await;
        if claimed.is_empty() {
            break;
        }
        order.extend(ids(&claimed));
        ack_all(&*store, &claimed).await;
    }
    assert_eq!(
        order,
        vec![quick.event_id, business_first.event_id],
        "the event written after the other transaction committed goes after it"
    );
}

/// A write transaction left open on the same store that wrote no event
/// (a batch job, an idle session) delays nothing (never wait
/// for strangers).
pub async fn strangers_never_hold_publication<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: BeginWrite,
{
    let store = factory.create(ManualClock::at_epoch()).await;
    let mut stranger = store.begin_write().await.unwrap();
    stranger.write_business_row().await.unwrap();
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let claimed = claim(&*store, &request("r1", 10)).await;
    assert_eq!(
        ids(&claimed),
        vec![e.event_id],
        "an open transaction that wrote no event held publication back"
    );
    stranger.commit().await.unwrap();
}

async fn ack_all(store: &(impl OutboxStore + ?Sized), claimed: &[ClaimedEvent]) {
    let leases: Vec<_> = claimed.iter().map(|c| c.lease.clone()).collect();
    store.ack(&leases).await.unwrap();
}

trait NowPlus {
    fn now_plus(&self, d: Duration) -> chrono::DateTime<chrono::Utc>;
}
impl NowPlus for ManualClock {
    fn now_plus(&self, d: Duration) -> chrono::DateTime<chrono::Utc> {
        crate::clock::add_duration(crate::Clock::now(self), d)
    }
}
