//! A hot key's backlog on PostgreSQL (DESIGN.md §2, issue 31): claims set
//! its rows aside in a lane, one entry per window instead of a row write
//! per event, so other keys' events pass it in one claim; the hot key still
//! goes in order, through a dead relay, a purge and a relay switched to
//! unordered claims, and every admin read counts its lane as pending.
#![cfg(feature = "postgres")]

mod plain_pick;
#[path = "../support/mod.rs"]
mod support;
mod waiting;

use std::collections::HashSet;
use std::time::Duration;

use outbox_core::store::{
    ClaimedEvent, EventState, FailReason, HeldBack, Nack, NackAction, OperatorAction, OutboxAdmin,
    OutboxStore, OutboxWriter, Release,
};
use outbox_core::testing::store_suite::{LEASE, drain_as, request};
use outbox_core::testing::{event, events_over_keys};
use outbox_core::{ErrorClass, EventId, ManualClock, NewEvent, Ordering, PoisonPolicy};
use outbox_sqlx::postgres::PgStore;
use support::pg::shared_store;

const BATCH: usize = 100;

fn ids(events: &[NewEvent]) -> Vec<EventId> {
    events.iter().map(|e| e.event_id).collect()
}

fn claimed_ids(claimed: &[ClaimedEvent]) -> Vec<EventId> {
    claimed.iter().map(|c| c.event.event_id).collect()
}

async fn ack(store: &PgStore, claimed: &[ClaimedEvent]) {
    let leases: Vec<_> = claimed.iter().map(|c| c.lease.clone()).collect();
    assert_eq!(store.ack(&leases).await.unwrap().applied, claimed.len());
}

/// `burst` events on key "hot" (transactions of 1,000), then one event on
/// each of 20 other keys; the hot key's relay takes its first batch and
/// keeps it in flight; another relay claims and must get the 20 others.
async fn hot_key_in_flight_others_claimed(
    store: &PgStore,
    burst: usize,
) -> (Vec<NewEvent>, Vec<ClaimedEvent>) {
    let hot: Vec<NewEvent> = (0..burst).map(|n| event("hot", n)).collect();
    for chunk in hot.chunks(1_000) {
        OutboxWriter::enqueue(store, chunk).await.unwrap();
    }
    let others = events_over_keys(20, 20);
    OutboxWriter::enqueue(store, &others).await.unwrap();
    let first = store
        .claim_batch(&request("hot-relay", BATCH))
        .await
        .unwrap()
        .events;
    assert_eq!(claimed_ids(&first), ids(&hot[..BATCH]));
    let second = store
        .claim_batch(&request("other-relay", BATCH))
        .await
        .unwrap()
        .events;
    assert_eq!(
        claimed_ids(&second).into_iter().collect::<HashSet<_>>(),
        ids(&others).into_iter().collect::<HashSet<_>>(),
        "one claim passes the hot key's whole backlog to the other keys"
    );
    ack(store, &second).await;
    (hot, first)
}

async fn scalar(store: &PgStore, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Transactions that last wrote the hot key's waiting rows (their xmins):
/// its producers' alone while no claim has written a row of it.
async fn hot_row_writers(store: &PgStore, schema: &str) -> i64 {
    scalar(
        store,
        &format!(
            "SELECT count(DISTINCT xmin::text) FROM {schema}.outbox_events
             WHERE partition_key = 'hot' AND status = 0"
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_keys_pass_a_hot_keys_backlog_without_a_row_written() {
    let clock = ManualClock::at_epoch();
    let (store, schema) = shared_store(clock.clone()).await;
    let (hot, first) = hot_key_in_flight_others_claimed(&store, 3_000).await;
    // Every hot row is as its producer wrote it: its inserting
    // transaction's xmin (three of them), status 0.
    let writers = hot_row_writers(&store, &schema).await;
    assert_eq!(writers, 3, "no hot row was written after its insert");
    let laned = scalar(
        &store,
        &format!("SELECT sum(cardinality(sequences) - taken)::int8 FROM {schema}.outbox_lanes"),
    )
    .await;
    assert_eq!(laned, 2_900);
    // Admin reads count the lane as pending.
    let stats = store.stats().await.unwrap();
    let claimable: u64 = stats.iter().map(|s| s.claimable).sum();
    let in_flight: u64 = stats.iter().map(|s| s.in_flight).sum();
    assert_eq!((claimable, in_flight), (2_900, 100), "{stats:?}");
    let waiting = hot[1_500].event_id;
    assert!(matches!(
        store.event_state(waiting).await.unwrap(),
        Some(EventState::Pending { .. })
    ));
    // A purge long after the cursor passed them deletes what was published
    // (the others) and nothing of the lane.
    ack(&store, &first).await;
    clock.advance(Duration::from_secs(60));
    let purged = store.purge_published(Duration::ZERO, 10_000).await.unwrap();
    assert_eq!(purged, 120, "the 20 others and the hot key's first batch");
    assert!(matches!(
        store.event_state(waiting).await.unwrap(),
        Some(EventState::Pending { .. })
    ));
    // The hot key's relay goes on from its lane, in order; one of its
    // batches dies with it (the lease expires) and comes back first.
    let mut published = Vec::new();
    let mut died = false;
    loop {
        let claimed = store
            .claim_batch(&request("hot-relay", BATCH))
            .await
            .unwrap()
            .events;
        if claimed.is_empty() {
            break;
        }
        if !died && published.len() == 1_000 {
            died = true;
            clock.advance(LEASE + Duration::from_secs(1));
            continue;
        }
        published.extend(claimed_ids(&claimed));
        ack(&store, &claimed).await;
    }
    assert!(died);
    assert_eq!(published, ids(&hot[BATCH..]), "the hot key in order, once");
    assert!(matches!(
        store.event_state(waiting).await.unwrap(),
        Some(EventState::Published { .. })
    ));
    let left = scalar(
        &store,
        &format!("SELECT count(*) FROM {schema}.outbox_lanes"),
    )
    .await;
    assert_eq!(left, 0, "emptied lanes are deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_switched_to_unordered_claims_takes_the_lanes() {
    let (store, _) = shared_store(ManualClock::at_epoch()).await;
    let (hot, first) = hot_key_in_flight_others_claimed(&store, 1_000).await;
    ack(&store, &first).await;
    let mut unordered = request("unordered-relay", BATCH);
    unordered.ordering = Ordering::Unordered;
    let mut published = HashSet::new();
    loop {
        let claimed = store.claim_batch(&unordered).await.unwrap().events;
        if claimed.is_empty() {
            break;
        }
        for id in claimed_ids(&claimed) {
            assert!(published.insert(id), "claimed twice");
        }
        ack(&store, &claimed).await;
    }
    assert_eq!(published, ids(&hot[BATCH..]).into_iter().collect());
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.iter().map(|s| s.claimable).sum::<u64>(), 0);
}

/// Hands back `claimed` unstarted (the relay stops a key at its first
/// failure and returns the rest of its batch).
async fn release_unstarted(store: &PgStore, claimed: &[ClaimedEvent]) {
    let releases: Vec<Release> = claimed
        .iter()
        .map(|c| Release::unstarted(c.lease.clone()))
        .collect();
    store.release(&releases).await.unwrap();
}

async fn nack(store: &PgStore, claimed: &ClaimedEvent, action: NackAction) {
    let nack = Nack {
        lease: claimed.lease.clone(),
        action,
        error_class: ErrorClass::Transient,
        error: "broker said no".into(),
    };
    assert_eq!(store.nack(&[nack]).await.unwrap().applied, 1);
}

/// The hot key's head retried, then failed blocking its key: nothing of
/// its lane goes before it, admin reads count the lane behind the block,
/// and skipping the failed head lets the rest go on, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_waits_behind_its_keys_backoff_and_blocking_failure() {
    let clock = ManualClock::at_epoch();
    let (store, _) = shared_store(clock.clone()).await;
    let (hot, first) = hot_key_in_flight_others_claimed(&store, 1_000).await;
    let mut req = request("hot-relay", BATCH);
    req.poison = PoisonPolicy::Block;
    nack(
        &store,
        &first[0],
        NackAction::Retry {
            after: Duration::from_secs(30),
        },
    )
    .await;
    release_unstarted(&store, &first[1..]).await;
    let early = store.claim_batch(&req).await.unwrap().events;
    assert!(
        early.is_empty(),
        "nothing of the key before its head's backoff"
    );
    clock.advance(Duration::from_secs(31));
    let again = store.claim_batch(&req).await.unwrap().events;
    assert_eq!(claimed_ids(&again), ids(&hot[..BATCH]));
    nack(
        &store,
        &again[0],
        NackAction::Fail {
            reason: FailReason::Permanent,
            block_key: true,
        },
    )
    .await;
    release_unstarted(&store, &again[1..]).await;
    let blocked = store.claim_batch(&req).await.unwrap().events;
    assert!(blocked.is_empty(), "nothing of a blocked key");
    let held = store.held_back().await.unwrap();
    assert!(
        held.iter().any(|h| matches!(
            h,
            HeldBack::BlockedKeys {
                keys: 1,
                waiting: 999
            }
        )),
        "{held:?}"
    );
    let stats = store.stats().await.unwrap();
    assert_eq!(
        stats.iter().map(|s| s.blocked).sum::<u64>(),
        999,
        "{stats:?}"
    );
    assert_eq!(
        stats.iter().map(|s| s.claimable).sum::<u64>(),
        0,
        "{stats:?}"
    );
    store
        .skip(hot[0].event_id, &OperatorAction::new("ops", "poison"))
        .await
        .unwrap();
    let mut published = Vec::new();
    loop {
        let claimed = store.claim_batch(&req).await.unwrap().events;
        if claimed.is_empty() {
            break;
        }
        published.extend(claimed_ids(&claimed));
        ack(&store, &claimed).await;
    }
    assert_eq!(published, ids(&hot[1..]), "the rest of the key, in order");
}

/// Other keys' events among a hot key's rows (one every 30 positions), the
/// hot key's batch in flight: windows hold some of them, so claims are not
/// empty, yet the cursor must not wait at the hot key and its rows must
/// not be written one by one: all 50 others in a few claims, every hot row
/// still as its producer wrote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_pass_a_hot_key_its_runs_interleaved_with_other_keys() {
    let (store, schema) = shared_store(ManualClock::at_epoch()).await;
    let mut stream = Vec::new();
    let mut others = Vec::new();
    for n in 0..50 {
        stream.extend((0..29).map(|i| event("hot", n * 29 + i)));
        let other = event(&format!("k{n}"), n);
        others.push(other.event_id);
        stream.push(other);
    }
    OutboxWriter::enqueue(&store, &stream).await.unwrap();
    let first = store
        .claim_batch(&request("hot-relay", BATCH))
        .await
        .unwrap()
        .events;
    // Its batch takes the first other keys' events beside the hot rows.
    let mut got: HashSet<EventId> = first
        .iter()
        .filter(|c| c.event.partition_key != "hot")
        .map(|c| c.event.event_id)
        .collect();
    let mut claims = 0;
    while got.len() < others.len() && claims < 20 {
        claims += 1;
        let claimed = store
            .claim_batch(&request("other-relay", BATCH))
            .await
            .unwrap()
            .events;
        assert!(claimed.iter().all(|c| c.event.partition_key != "hot"));
        got.extend(claimed_ids(&claimed));
    }
    assert_eq!(got, others.into_iter().collect::<HashSet<_>>());
    assert!(claims <= 6, "{claims} claims to pass the hot key");
    let writers = hot_row_writers(&store, &schema).await;
    assert_eq!(writers, 1, "no hot row was written after its insert");
}

/// Drains `relay` (per-key order) to the end, acking each batch.
async fn drain(store: &PgStore, relay: &str) -> Vec<EventId> {
    drain_as(store, &request(relay, BATCH)).await
}

/// A claim made while the hot key is between batches takes the other
/// keys' events first and fills the rest of the batch from the hot key's
/// lane, in its order: in claim order alone the lane's older positions
/// filled every such batch, and the other keys waited for a claim made
/// while the hot key was in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_keys_go_first_in_a_batch_the_hot_keys_lane_fills() {
    let (store, _) = shared_store(ManualClock::at_epoch()).await;
    let (hot, first) = hot_key_in_flight_others_claimed(&store, 3_000).await;
    ack(&store, &first).await;
    let others = events_over_keys(20, 20);
    OutboxWriter::enqueue(&store, &others).await.unwrap();
    let claimed = store
        .claim_batch(&request("any-relay", BATCH))
        .await
        .unwrap()
        .events;
    let (theirs, hot_rows): (Vec<_>, Vec<_>) = claimed
        .iter()
        .map(|c| c.event.event_id)
        .partition(|id| others.iter().any(|o| o.event_id == *id));
    assert_eq!(theirs.len(), 20, "every other key's event in this batch");
    assert_eq!(
        hot_rows,
        ids(&hot[BATCH..2 * BATCH - 20]),
        "the hot key's next, in order"
    );
    ack(&store, &claimed).await;
    let mut published = hot_rows;
    published.extend(drain(&store, "any-relay").await);
    assert_eq!(published, ids(&hot[BATCH..]), "the hot key in order, once");
}
