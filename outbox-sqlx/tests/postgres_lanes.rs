//! A hot key's backlog on PostgreSQL (DESIGN.md §2, issue 31): claims set
//! its rows aside in a lane, one entry per window instead of a row write
//! per event, so other keys' events pass it in one claim; the hot key still
//! goes in order, through a dead relay, a purge and a relay switched to
//! unordered claims, and every admin read counts its lane as pending.
#![cfg(feature = "postgres")]

mod support;

use std::collections::HashSet;
use std::time::Duration;

use outbox_core::store::{
    ClaimedEvent, EventState, FailReason, HeldBack, Nack, NackAction, OperatorAction, OutboxAdmin,
    OutboxStore, OutboxWriter, Release,
};
use outbox_core::testing::store_suite::{LEASE, request};
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
    let mut published = Vec::new();
    loop {
        let claimed = store
            .claim_batch(&request(relay, BATCH))
            .await
            .unwrap()
            .events;
        if claimed.is_empty() {
            return published;
        }
        published.extend(claimed_ids(&claimed));
        ack(store, &claimed).await;
    }
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

/// What a pick decided, as text: its outputs (the deferred positions as a
/// set), the lanes and the pending rows it left behind; and whether it held
/// the cursor inside the window.
#[derive(Debug, PartialEq)]
struct PickOutcome {
    decided: String,
    lanes: String,
    rows: String,
    held: bool,
}

/// Runs `function` (outbox_pick or outbox_pick_plain) with `args` in a
/// transaction that is rolled back: the state is the same for the next.
async fn pick_outcome(
    store: &PgStore,
    schema: &str,
    function: &str,
    args: (&str, i64, i64, i32, bool, bool),
) -> Option<PickOutcome> {
    let mut tx = store.pool().begin().await.unwrap();
    let (decided, stop, picked): (String, Option<i64>, i32) = sqlx::query_as(&format!(
        "SELECT format('%s | %s | %s | %s | %s | %s | %s | %s | %s', sequences, positions,
                       from_stream, keys, suspect, stop,
                       ARRAY(SELECT unnest(deferred_positions) ORDER BY 1), deferring, dominated),
                stop, coalesce(cardinality(sequences), 0)
         FROM {schema}.{function}($1::timestamptz, $2, $3, $4, $5, $6)"
    ))
    .bind(args.0)
    .bind(args.1)
    .bind(args.2)
    .bind(args.3)
    .bind(args.4)
    .bind(args.5)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let lanes: String = sqlx::query_scalar(&format!(
        "SELECT coalesce(string_agg(concat_ws(' ', partition_key, first_position, sequences,
                                              positions, size, taken), '; '
                                    ORDER BY partition_key, first_position), '')
         FROM {schema}.outbox_lanes"
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let rows: String = sqlx::query_scalar(&format!(
        "SELECT coalesce(string_agg(concat_ws(':', sequence, status, position), ','
                                    ORDER BY sequence), '')
         FROM {schema}.outbox_events WHERE status <> 2"
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    // Held: the cursor stops inside the window with the batch not full.
    let held = stop.is_some_and(|stop| stop < args.2 && picked < args.3);
    stop.map(|_| PickOutcome {
        decided,
        lanes,
        rows,
        held,
    })
}

/// How many states the plain pick was compared on, and in how many it had
/// keys in flight to hold the cursor at or to set aside.
#[derive(Default, Debug)]
struct PlainCoverage {
    compared: usize,
    fell_back: usize,
    held: usize,
    set_aside: usize,
    dominated: usize,
}

/// Compares both picks on the store's state as it is, over the whole
/// stream and over a batch's window, ordered and not, deferring and not.
async fn compare_picks(store: &PgStore, schema: &str, limit: i32, coverage: &mut PlainCoverage) {
    let (now, from, end): (String, i64, i64) = sqlx::query_as(&format!(
        "SELECT {schema}.outbox_now()::text, c.position, c.end_position
         FROM {schema}.outbox_cursor_now c"
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    for to in [end, end.min(from + i64::from(limit) * 5 / 4)] {
        for (ordered, defer) in [(true, false), (true, true), (false, false)] {
            let args = (now.as_str(), from, to, limit, ordered, defer);
            let plain = pick_outcome(store, schema, "outbox_pick_plain", args).await;
            let Some(plain) = plain else {
                coverage.fell_back += 1;
                continue;
            };
            let general = pick_outcome(store, schema, "outbox_pick", args)
                .await
                .expect("the general pick always decides");
            assert_eq!(plain, general, "pick({args:?})");
            coverage.compared += 1;
            coverage.held += usize::from(plain.held);
            coverage.set_aside += usize::from(!plain.lanes.is_empty());
            coverage.dominated += usize::from(plain.decided.ends_with("| t"));
        }
    }
}

/// The plain pick (outbox_pick_plain: nothing outside the stream, every
/// row due) decides as the general pick on every state it takes, claims
/// and settlements of random sizes over a hot key and many keys, batches
/// left in flight young and old: the same picks, stop, deferrals and lanes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_pick_decides_as_the_general_one_wherever_it_applies() {
    let clock = ManualClock::at_epoch();
    let (store, schema) = shared_store(clock.clone()).await;
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut in_flight: Vec<Vec<ClaimedEvent>> = Vec::new();
    let mut coverage = PlainCoverage::default();
    // First a hot key's young batch in flight with its burst behind it: a
    // window its rows dominate.
    let hot: Vec<NewEvent> = (0..300).map(|i| event("hot", i)).collect();
    OutboxWriter::enqueue(&store, &hot).await.unwrap();
    let first = store.claim_batch(&request("hot-relay", 50)).await.unwrap();
    in_flight.push(first.events);
    for limit in [20, 100, 200] {
        compare_picks(&store, &schema, limit, &mut coverage).await;
    }
    let mut n = hot.len();
    for _ in 0..40 {
        let burst: Vec<NewEvent> = match random(3) {
            0 => (0..150).map(|i| event("hot", n + i)).collect(),
            1 => (0..40)
                .map(|i| event(&format!("few{}", i % 4), n + i))
                .collect(),
            _ => (0..120)
                .map(|i| event(&format!("k{}", random(60)), n + i))
                .collect(),
        };
        n += burst.len();
        OutboxWriter::enqueue(&store, &burst).await.unwrap();
        for _ in 0..random(3) + 1 {
            let mut req = request(&format!("relay-{}", random(4)), 10 + random(120) as usize);
            if random(6) == 0 {
                req.ordering = Ordering::Unordered;
            }
            let claimed = store.claim_batch(&req).await.unwrap().events;
            if random(2) == 0 {
                in_flight.push(claimed);
            } else {
                ack(&store, &claimed).await;
            }
        }
        if random(2) == 0 && !in_flight.is_empty() {
            let settled = in_flight.remove(0);
            let leases: Vec<_> = settled.iter().map(|c| c.lease.clone()).collect();
            store.ack(&leases).await.unwrap();
        }
        clock.advance(Duration::from_millis(random(700)));
        compare_picks(&store, &schema, 20 + random(100) as i32, &mut coverage).await;
    }
    assert!(
        coverage.compared >= 40
            && coverage.held >= 5
            && coverage.set_aside >= 5
            && coverage.dominated >= 3,
        "the comparison saw too few of the states it is for: {coverage:?}"
    );
}

/// The plain pick at the edges of a dominated window (a young key's run of
/// 32 rows; its rows half the window, an odd window's half a fraction):
/// the same decision as the general pick on each side of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_pick_decides_as_the_general_one_at_a_dominated_windows_edges() {
    let mut coverage = PlainCoverage::default();
    for (hot_rows, other_rows) in [(31, 0), (32, 0), (32, 32), (32, 33), (40, 39), (40, 41)] {
        let (store, schema) = shared_store(ManualClock::at_epoch()).await;
        let mut stream: Vec<NewEvent> = (0..50 + hot_rows).map(|i| event("hot", i)).collect();
        stream.extend((0..other_rows).map(|i| event(&format!("k{i}"), 1_000 + i)));
        OutboxWriter::enqueue(&store, &stream).await.unwrap();
        let young = store.claim_batch(&request("hot-relay", 50)).await.unwrap();
        assert_eq!(young.events.len(), 50);
        for limit in [20, 60, 100] {
            compare_picks(&store, &schema, limit, &mut coverage).await;
        }
    }
    assert!(
        coverage.compared >= 30 && coverage.dominated >= 6,
        "{coverage:?}"
    );
}
