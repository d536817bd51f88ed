//! The plain pick (outbox_pick_plain) against the general one
//! (outbox_pick): on every state where the plain pick decides, both decide
//! the same; the states include keys in flight, set-aside rows (and their
//! keys' next claims, which take them back), dominated windows and nothing
//! in flight at all (the plain pick's shortest way), and keys that wait
//! outside the stream elsewhere (blocked, backing off, delayed).

use std::time::Duration;

use outbox_core::store::{
    ClaimRequest, ClaimedEvent, FailReason, NackAction, OutboxStore, OutboxWriter,
};
use outbox_core::testing::event;
use outbox_core::testing::store_suite::request;
use outbox_core::{Clock, ManualClock, NewEvent, Ordering, PoisonPolicy};
use outbox_sqlx::postgres::PgStore;

use crate::support::pg::shared_store;
use crate::{ack, nack};

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
    /// Compared while rows waited outside the stream (the plain pick's
    /// case since keys that wait elsewhere no longer leave it).
    beside_waiting: usize,
    held: usize,
    set_aside: usize,
    dominated: usize,
    /// Compared with nothing in flight from the window on: the plain pick's
    /// shortest way (no live key, no position taken beyond the cursor).
    nothing_in_flight: usize,
    /// Compared (per key) with lane rows of keys not in flight to take.
    lanes_to_take: usize,
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
    let (keys_in_flight, taken_beyond, lanes_to_take, waiting): (bool, bool, bool, bool) =
        sqlx::query_as(&format!(
            "SELECT EXISTS (SELECT 1 FROM {schema}.outbox_leases
                        WHERE token >= {schema}.outbox_live_from()
                          AND cardinality(held) > 0 AND cardinality(keys) > 0),
                EXISTS (SELECT 1 FROM {schema}.outbox_leases
                        WHERE token >= {schema}.outbox_kept_from() AND max_position >= $1),
                EXISTS (SELECT 1 FROM {schema}.outbox_lanes z
                        WHERE z.partition_key NOT IN (
                            SELECT unnest(keys) FROM {schema}.outbox_leases
                            WHERE token >= {schema}.outbox_live_from() AND cardinality(held) > 0)),
                EXISTS (SELECT 1 FROM {schema}.outbox_events WHERE status IN (3, 4, 5))"
        ))
        .bind(from)
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
            coverage.beside_waiting += usize::from(waiting);
            coverage.held += usize::from(plain.held);
            coverage.set_aside += usize::from(!plain.lanes.is_empty());
            coverage.dominated += usize::from(plain.decided.ends_with("| t"));
            coverage.nothing_in_flight += usize::from(!(taken_beyond || ordered && keys_in_flight));
            coverage.lanes_to_take += usize::from(ordered && lanes_to_take);
        }
    }
}

/// A seeded pseudo-random source (xorshift64): `random(n)` is below `n`,
/// the same sequence every run.
fn xorshift(mut state: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
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
    let mut random = xorshift(0x9e37_79b9_7f4a_7c15);
    let mut in_flight: Vec<Vec<ClaimedEvent>> = Vec::new();
    let mut coverage = PlainCoverage::default();
    // Store time is the server's clock plus the manual shift, so a lease
    // also runs out in real time. The rounds below advance the clock by
    // 14 s and the batches left in flight are settled at the end: with the
    // suite's 10 s lease, the oldest (7.7 s of shift old) expired whenever
    // the rounds after it took 2.3 s on a busy machine, another relay took
    // its rows and the final ack found none (CI, once). No lease here runs
    // out during the test.
    let claim = |owner: &str, limit: usize| ClaimRequest {
        lease_duration: Duration::from_secs(600),
        ..request(owner, limit)
    };
    // First a hot key's young batch in flight with its burst behind it: a
    // window its rows dominate.
    let hot: Vec<NewEvent> = (0..300).map(|i| event("hot", i)).collect();
    OutboxWriter::enqueue(&store, &hot).await.unwrap();
    let first = store.claim_batch(&claim("hot-relay", 50)).await.unwrap();
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
            let mut req = claim(&format!("relay-{}", random(4)), 10 + random(120) as usize);
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
    // Everything settled and drained, then new rows: nothing in flight.
    for settled in in_flight.drain(..) {
        ack(&store, &settled).await;
    }
    loop {
        let claimed = store
            .claim_batch(&request("drainer", 500))
            .await
            .unwrap()
            .events;
        if claimed.is_empty() {
            break;
        }
        ack(&store, &claimed).await;
    }
    let fresh: Vec<NewEvent> = (0..200)
        .map(|i| event(&format!("k{}", i % 7), n + i))
        .collect();
    OutboxWriter::enqueue(&store, &fresh).await.unwrap();
    for limit in [1, 30, 199, 200, 500] {
        compare_picks(&store, &schema, limit, &mut coverage).await;
    }
    assert!(
        coverage.compared >= 40
            && coverage.held >= 5
            && coverage.set_aside >= 5
            && coverage.dominated >= 3
            && coverage.nothing_in_flight >= 10
            && coverage.lanes_to_take >= 5,
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

/// The plain pick where a hot key's burst was set aside and its batch has
/// since been acked: its lanes (64 rows or more: a burst, which fills what
/// the other keys leave of a batch), then more of its rows and other keys'
/// rows in the stream behind them. The same decision as the general pick,
/// for batches smaller and larger than what waits (a small one leaves the
/// hot key's stream rows before its cut, which go into its lane).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_pick_decides_as_the_general_one_on_a_hot_keys_lanes() {
    let mut coverage = PlainCoverage::default();
    // The last two with every other key's batch acked too: no key in
    // flight, the burst's key only in its lanes.
    for (hot_rows, late_hot, late_others, others_acked) in [
        (300, 0, 40, false),
        (120, 0, 0, false),
        (90, 30, 200, false),
        (200, 80, 20, false),
        (90, 30, 200, true),
        (200, 80, 20, true),
    ] {
        let (store, schema) = shared_store(ManualClock::at_epoch()).await;
        let mut stream: Vec<NewEvent> = (0..hot_rows).map(|i| event("hot", i)).collect();
        stream.extend((0..30).map(|i| event(&format!("k{}", i % 5), 1_000 + i)));
        OutboxWriter::enqueue(&store, &stream).await.unwrap();
        let young = store.claim_batch(&request("hot-relay", 50)).await.unwrap();
        // Another relay's claim sets the hot key's rows aside, picking the
        // other keys' events behind them.
        let others = store.claim_batch(&request("relay", 20)).await.unwrap();
        assert!(others.events.iter().all(|c| c.event.partition_key != "hot"));
        let mut late: Vec<NewEvent> = (0..late_hot).map(|i| event("hot", 500 + i)).collect();
        late.extend((0..late_others).map(|i| event(&format!("k{}", i % 7), 2_000 + i)));
        OutboxWriter::enqueue(&store, &late).await.unwrap();
        ack(&store, &young.events).await;
        if others_acked {
            ack(&store, &others.events).await;
        }
        // The late rows in claim order, beside the lanes (a claim's tick).
        sqlx::query(&format!("SELECT {schema}.outbox_tick()"))
            .execute(store.pool())
            .await
            .unwrap();
        for limit in [10, 40, 100, 400] {
            compare_picks(&store, &schema, limit, &mut coverage).await;
        }
    }
    assert!(coverage.lanes_to_take >= 16, "{coverage:?}");
}

/// The plain pick beside keys that wait outside the stream: one blocked
/// by a failed row with events parked behind it, one whose head backs off
/// with events in its lane, events delayed on keys of their own; then
/// traffic on other keys and, now and then, on the waiting keys (the
/// window then holds a key that waits: the general pick's case). The same
/// decision as the general pick wherever the plain one decides, and then
/// again once the backoff and the delays are due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_pick_decides_as_the_general_one_beside_keys_that_wait() {
    let clock = ManualClock::at_epoch();
    let (store, schema) = shared_store(clock.clone()).await;
    let mut coverage = PlainCoverage::default();
    let mut req = request("relay", 100);
    req.poison = PoisonPolicy::Block;
    let heads = vec![event("blocked", 0), event("retrying", 0)];
    OutboxWriter::enqueue(&store, &heads).await.unwrap();
    let claimed = store.claim_batch(&req).await.unwrap().events;
    assert_eq!(claimed.len(), 2);
    for head in &claimed {
        let action = if head.event.partition_key == "blocked" {
            NackAction::Fail {
                reason: FailReason::Permanent,
                block_key: true,
            }
        } else {
            NackAction::Retry {
                after: Duration::from_secs(60),
            }
        };
        nack(&store, head, action).await;
    }
    let later = clock.now() + chrono::Duration::seconds(30);
    let mut waiting: Vec<NewEvent> = (1..20).map(|i| event("blocked", i)).collect();
    waiting.extend((1..20).map(|i| event("retrying", i)));
    waiting.extend((0..10).map(|i| {
        let mut delayed = event(&format!("later{i}"), i);
        delayed.available_at = Some(later);
        delayed
    }));
    OutboxWriter::enqueue(&store, &waiting).await.unwrap();
    // Claims move them out of the stream: parked, in a lane, tracked.
    assert!(store.claim_batch(&req).await.unwrap().events.is_empty());
    let mut random = xorshift(0x2545_f491_4f6c_dd1d);
    let mut in_flight: Vec<Vec<ClaimedEvent>> = Vec::new();
    let mut n = 100;
    for round in 0..30 {
        let key = |random: &mut dyn FnMut(u64) -> u64| match random(80) {
            0 => "blocked".to_string(),
            1 => "retrying".to_string(),
            2..=9 => "hot".to_string(),
            _ => format!("k{}", random(40)),
        };
        let burst: Vec<NewEvent> = (0..10 + random(60) as usize)
            .map(|i| event(&key(&mut random), n + i))
            .collect();
        n += burst.len();
        OutboxWriter::enqueue(&store, &burst).await.unwrap();
        compare_picks(&store, &schema, 10 + random(80) as i32, &mut coverage).await;
        let mut claim = req.clone();
        claim.owner = outbox_core::RelayId::new(format!("relay-{}", random(3)));
        claim.limit = 5 + random(60) as usize;
        let claimed = store.claim_batch(&claim).await.unwrap().events;
        assert!(
            claimed
                .iter()
                .all(|c| c.event.partition_key != "blocked" && c.event.partition_key != "retrying"),
            "nothing of a key that waits, round {round}"
        );
        if random(2) == 0 {
            in_flight.push(claimed);
        } else {
            ack(&store, &claimed).await;
        }
        if random(2) == 0 && !in_flight.is_empty() {
            ack(&store, &in_flight.remove(0)).await;
        }
        compare_picks(&store, &schema, 10 + random(80) as i32, &mut coverage).await;
    }
    assert!(
        coverage.beside_waiting >= 20 && coverage.fell_back >= 5,
        "the comparison saw too few of the states it is for: {coverage:?}"
    );
    // Everything else drained, then the delays due (the backoff not yet):
    // tracked rows due on keys of no window, which the plain pick does
    // not take; it gives way to the general pick, which does.
    for settled in in_flight.drain(..) {
        ack(&store, &settled).await;
    }
    loop {
        let claimed = store.claim_batch(&req).await.unwrap().events;
        if claimed.is_empty() {
            break;
        }
        ack(&store, &claimed).await;
    }
    clock.advance(Duration::from_secs(31));
    // Store time follows the clock at the store's next call.
    outbox_core::store::OutboxAdmin::stats(&store)
        .await
        .unwrap();
    let before = coverage.compared;
    compare_picks(&store, &schema, 50, &mut coverage).await;
    assert_eq!(
        coverage.compared, before,
        "due tracked rows: the general pick's case"
    );
    let due = store.claim_batch(&req).await.unwrap().events;
    assert_eq!(due.len(), 10, "the delayed events, now due");
}
