//! What a claim reads of keys that wait (DESIGN.md §2, issue 31): of a key
//! blocked by a failed row, its blocking row, not the events parked behind
//! it; of a key whose tracked rows are all for later (a delayed event, a
//! retry backing off), nothing. Each claim used to visit every waiting key
//! and read up to a batch of its rows (100 blocked keys with 300 parked
//! each: 66 ms a claim instead of 2.5; 10,000 delayed events on their own
//! keys: 120 ms), so a week of `PoisonPolicy::Block` or of scheduled
//! events slowed every other key's claims.

use chrono::Duration as Span;
use outbox_core::store::{FailReason, NackAction, OutboxStore, OutboxWriter};
use outbox_core::testing::event;
use outbox_core::testing::store_suite::request;
use outbox_core::{Clock, ManualClock, NewEvent, PoisonPolicy};
use outbox_sqlx::postgres::PgStore;
use sqlx::Row;

use super::{BATCH, ack, claimed_ids, drain, nack, shared_store};

const WAITING_KEYS: usize = 10;
const PARKED_PER_KEY: usize = 300;
const DELAYED_KEYS: usize = 300;
const RETRYING_KEYS: usize = 200;
const BEHIND_RETRY: usize = 2;

fn others() -> Vec<NewEvent> {
    (0..10).map(|k| event(&format!("other-{k}"), 0)).collect()
}

/// Claims as a relay's would until `expected` rows of `schema` have
/// `status` (the claims met them in the stream and moved them out).
async fn claim_until_moved(store: &PgStore, schema: &str, status: i16, expected: usize) {
    let count = format!("SELECT count(*) FROM {schema}.outbox_events WHERE status = {status}");
    claim_until_counted(store, &count, expected).await;
}

/// Claims as a relay's would (none taking anything) until `count` (SQL)
/// says `expected`.
async fn claim_until_counted(store: &PgStore, count: &str, expected: usize) {
    let mut req = request("relay", BATCH);
    req.poison = PoisonPolicy::Block;
    let mut moved = 0;
    for _ in 0..100 {
        assert!(store.claim_batch(&req).await.unwrap().events.is_empty());
        moved = sqlx::query_scalar::<_, i64>(count)
            .fetch_one(store.pool())
            .await
            .unwrap() as usize;
        if moved == expected {
            return;
        }
    }
    panic!("{count}: {moved}, not {expected}");
}

/// Enqueues [`others`], then claims as the store does, in a transaction of
/// this test's own (rolled back) whose reads of the events table are
/// counted (the events and the lanes); asserts the others are picked and
/// returns the rows read.
/// Then the store's own claim takes the others, and they are acked.
async fn rows_read_by_a_claim_of_others(store: &PgStore, schema: &str) -> i64 {
    let others = others();
    OutboxWriter::enqueue(store, &others).await.unwrap();
    // The counters of this connection's transaction: they also hold its
    // earlier transactions' reads not yet flushed, hence the difference.
    let reads = format!(
        "SELECT sum(coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0))::bigint
         FROM pg_stat_xact_user_tables
         WHERE relid = '{schema}.outbox_events'::regclass OR relid = '{schema}.outbox_lanes'::regclass"
    );
    let mut tx = store.pool().begin().await.unwrap();
    let before: i64 = sqlx::query_scalar(&reads)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let picked = sqlx::query(&format!(
        "SELECT count(*) AS n FROM {schema}.outbox_claim('counted', {BATCH}, interval '30 seconds',
             3, true, true)"
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap()
    .get::<i64, _>("n");
    let read = sqlx::query_scalar::<_, i64>(&reads)
        .fetch_one(&mut *tx)
        .await
        .unwrap()
        - before;
    tx.rollback().await.unwrap();
    assert_eq!(picked, others.len() as i64, "the other keys' events go");
    let claimed = store
        .claim_batch(&request("relay", BATCH))
        .await
        .unwrap()
        .events;
    assert_eq!(
        claimed_ids(&claimed).len(),
        others.len(),
        "the store's own claim agrees"
    );
    ack(store, &claimed).await;
    read
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reads_a_blocked_keys_blocking_row_not_what_is_parked_behind_it() {
    let (store, schema) = shared_store(ManualClock::at_epoch()).await;
    let mut req = request("relay", BATCH);
    req.poison = PoisonPolicy::Block;
    let heads: Vec<_> = (0..WAITING_KEYS)
        .map(|k| event(&format!("blocked-{k}"), 0))
        .collect();
    OutboxWriter::enqueue(&store, &heads).await.unwrap();
    let claimed = store.claim_batch(&req).await.unwrap().events;
    assert_eq!(claimed.len(), WAITING_KEYS);
    for head in &claimed {
        let fail = NackAction::Fail {
            reason: FailReason::Permanent,
            block_key: true,
        };
        nack(&store, head, fail).await;
    }
    let behind: Vec<_> = (1..=PARKED_PER_KEY)
        .flat_map(|n| (0..WAITING_KEYS).map(move |k| event(&format!("blocked-{k}"), n)))
        .collect();
    OutboxWriter::enqueue(&store, &behind).await.unwrap();
    claim_until_moved(&store, &schema, 5, WAITING_KEYS * PARKED_PER_KEY).await;

    let read = rows_read_by_a_claim_of_others(&store, &schema).await;
    assert!(
        read < 100,
        "a claim beside {WAITING_KEYS} blocked keys read {read} event rows \
         ({} parked behind them)",
        WAITING_KEYS * PARKED_PER_KEY
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reads_nothing_of_keys_whose_events_are_all_for_later() {
    let clock = ManualClock::at_epoch();
    let (store, schema) = shared_store(clock.clone()).await;
    let later = clock.now() + Span::hours(1);
    let delayed: Vec<_> = (0..DELAYED_KEYS)
        .map(|k| {
            let mut e = event(&format!("delayed-{k}"), 0);
            e.available_at = Some(later);
            e
        })
        .collect();
    OutboxWriter::enqueue(&store, &delayed).await.unwrap();
    claim_until_moved(&store, &schema, 4, DELAYED_KEYS).await;

    let read = rows_read_by_a_claim_of_others(&store, &schema).await;
    assert!(
        read < 100,
        "a claim beside {DELAYED_KEYS} delayed events read {read} event rows"
    );

    clock.advance(std::time::Duration::from_secs(3_601));
    let published = drain(&store, "relay").await.len();
    assert_eq!(published, DELAYED_KEYS, "every delayed event, once due");
}

/// Keys whose heads back off after a failed publish (a broker outage),
/// their later events set aside in lanes behind them: claims meanwhile
/// read neither, and once the backoff ends each key goes on in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reads_no_lane_behind_a_retry_backing_off_and_the_key_resumes_in_order() {
    let clock = ManualClock::at_epoch();
    let (store, schema) = shared_store(clock.clone()).await;
    let key = |k: usize| format!("retrying-{k}");
    let heads: Vec<_> = (0..RETRYING_KEYS).map(|k| event(&key(k), 0)).collect();
    OutboxWriter::enqueue(&store, &heads).await.unwrap();
    let mut claimed = Vec::new();
    while claimed.len() < RETRYING_KEYS {
        let batch = store.claim_batch(&request("relay", BATCH)).await.unwrap();
        assert!(!batch.events.is_empty());
        claimed.extend(batch.events);
    }
    for head in &claimed {
        let retry = NackAction::Retry {
            after: std::time::Duration::from_secs(60),
        };
        nack(&store, head, retry).await;
    }
    let behind: Vec<_> = (1..=BEHIND_RETRY)
        .flat_map(|n| (0..RETRYING_KEYS).map(move |k| event(&key(k), n)))
        .collect();
    OutboxWriter::enqueue(&store, &behind).await.unwrap();
    let laned = format!("SELECT coalesce(sum(size - taken), 0)::bigint FROM {schema}.outbox_lanes");
    claim_until_counted(&store, &laned, behind.len()).await;

    let read = rows_read_by_a_claim_of_others(&store, &schema).await;
    assert!(
        read < 100,
        "a claim beside {RETRYING_KEYS} keys backing off read {read} rows"
    );

    clock.advance(std::time::Duration::from_secs(61));
    let by_id: std::collections::HashMap<_, _> = heads
        .iter()
        .chain(&behind)
        .map(|e| (e.event_id, e.clone()))
        .collect();
    let published: Vec<NewEvent> = drain(&store, "relay")
        .await
        .iter()
        .map(|id| by_id[id].clone())
        .collect();
    assert_eq!(published.len(), heads.len() + behind.len(), "all of them");
    for k in 0..RETRYING_KEYS {
        let of_key: Vec<_> = published
            .iter()
            .filter(|e| e.partition_key == key(k))
            .map(|e| e.event_id)
            .collect();
        let expected: Vec<_> = heads
            .iter()
            .chain(&behind)
            .filter(|e| e.partition_key == key(k))
            .map(|e| e.event_id)
            .collect();
        assert_eq!(of_key, expected, "key {k} in order");
    }
}
