//! What a claim reads of keys blocked by a failed row: their blocking row,
//! not the events parked behind it. Each claim used to read up to a batch
//! of parked rows per blocked key (100 keys with 300 parked each: 66 ms a
//! claim instead of 2.5), so a week of `PoisonPolicy::Block` slowed every
//! other key's claims.

use outbox_core::store::{FailReason, NackAction, OutboxStore, OutboxWriter};
use outbox_core::testing::event;
use outbox_core::testing::store_suite::request;
use outbox_core::{ManualClock, PoisonPolicy};
use sqlx::Row;

use super::{BATCH, ack, claimed_ids, nack, shared_store};

const BLOCKED_KEYS: usize = 10;
const PARKED_PER_KEY: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reads_a_blocked_keys_blocking_row_not_what_is_parked_behind_it() {
    let (store, schema) = shared_store(ManualClock::at_epoch()).await;
    let mut req = request("relay", BATCH);
    req.poison = PoisonPolicy::Block;
    let heads: Vec<_> = (0..BLOCKED_KEYS)
        .map(|k| event(&format!("blocked-{k}"), 0))
        .collect();
    OutboxWriter::enqueue(&store, &heads).await.unwrap();
    let claimed = store.claim_batch(&req).await.unwrap().events;
    assert_eq!(claimed.len(), BLOCKED_KEYS);
    for head in &claimed {
        let fail = NackAction::Fail {
            reason: FailReason::Permanent,
            block_key: true,
        };
        nack(&store, head, fail).await;
    }
    let behind: Vec<_> = (1..=PARKED_PER_KEY)
        .flat_map(|n| (0..BLOCKED_KEYS).map(move |k| event(&format!("blocked-{k}"), n)))
        .collect();
    OutboxWriter::enqueue(&store, &behind).await.unwrap();
    // Claims meet the blocked keys' events in the stream and park them.
    let count_parked = format!("SELECT count(*) FROM {schema}.outbox_events WHERE status = 5");
    let mut parked = 0;
    for _ in 0..100 {
        assert!(store.claim_batch(&req).await.unwrap().events.is_empty());
        parked = sqlx::query_scalar::<_, i64>(&count_parked)
            .fetch_one(store.pool())
            .await
            .unwrap() as usize;
        if parked == BLOCKED_KEYS * PARKED_PER_KEY {
            break;
        }
    }
    assert_eq!(parked, BLOCKED_KEYS * PARKED_PER_KEY);

    let others: Vec<_> = (0..10).map(|k| event(&format!("other-{k}"), 0)).collect();
    OutboxWriter::enqueue(&store, &others).await.unwrap();
    // The claim as the store runs it, in a transaction of this test's
    // own (rolled back), whose reads of the events table are counted.
    let mut tx = store.pool().begin().await.unwrap();
    let picked = sqlx::query(&format!(
        "SELECT count(*) AS n FROM {schema}.outbox_claim('counted', {BATCH}, interval '30 seconds',
             3, true, true)"
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap()
    .get::<i64, _>("n");
    let fetched: i64 = sqlx::query_scalar(
        "SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)
         FROM pg_stat_xact_user_tables WHERE relid = $1::regclass",
    )
    .bind(format!("{schema}.outbox_events"))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(picked, others.len() as i64, "the other keys' events go");
    assert!(
        fetched < 200,
        "a claim beside {BLOCKED_KEYS} blocked keys read {fetched} event rows \
         ({} parked behind them)",
        BLOCKED_KEYS * PARKED_PER_KEY
    );

    let claimed = store.claim_batch(&req).await.unwrap().events;
    assert_eq!(
        claimed_ids(&claimed).len(),
        others.len(),
        "the store's own claim agrees"
    );
    ack(&store, &claimed).await;
}
