//! Where claims start reading (the claim-turn row's floors), with a read
//! view held: InnoDB keeps every index entry a lease or an ack
//! delete-marks while any session's view is open, and a claim that read
//! from the start of the pending or in-flight range stepped over all of
//! them. These pin the floors moving, and the paths that must not let a
//! row fall behind them: a late commit, a retry, a release.

use std::time::Duration;

use outbox_core::store::{Nack, NackAction, OutboxStore, Release};
use outbox_core::testing::{event, store_suite};
use outbox_core::{ErrorClass, EventId, ManualClock, OutboxWriter};
use outbox_sqlx::mysql::MySqlStore;
use sqlx::{Connection, Executor, MySqlConnection};

use super::{store_on, url};

/// A table of the test's database, qualified.
fn table(store: &MySqlStore, suffix: &str) -> String {
    let sql = store.schema_sql();
    let database = sql
        .split("CREATE TABLE IF NOT EXISTS ")
        .nth(1)
        .and_then(|rest| rest.split('.').next())
        .expect("a qualified table in the schema");
    format!("{database}.outbox_{suffix}")
}

/// The claim-turn row's (scan_from, flight_from).
async fn floors(store: &MySqlStore) -> (i64, i64) {
    let turn = table(store, "claim_lock");
    sqlx::query_as(&format!(
        "SELECT scan_from, flight_from FROM {turn} WHERE id = 1"
    ))
    .fetch_one(store.pool())
    .await
    .unwrap()
}

async fn claim_ids(store: &MySqlStore, limit: usize) -> Vec<EventId> {
    let batch = store
        .claim_batch(&store_suite::request("r", limit))
        .await
        .unwrap();
    batch.events.iter().map(|c| c.event.event_id).collect()
}

/// Claims and acks until a claim comes back empty; returns what it acked.
async fn drain(store: &MySqlStore, limit: usize) -> Vec<EventId> {
    let mut acked = Vec::new();
    loop {
        let batch = store
            .claim_batch(&store_suite::request("r", limit))
            .await
            .unwrap();
        if batch.events.is_empty() {
            return acked;
        }
        let leases: Vec<_> = batch.events.iter().map(|c| c.lease.clone()).collect();
        store.ack(&leases).await.unwrap();
        acked.extend(batch.events.iter().map(|c| c.event.event_id));
    }
}

#[tokio::test]
async fn with_a_read_view_held_claims_start_past_what_was_published() {
    let store = store_on(ManualClock::at_epoch()).await;
    let mut view = MySqlConnection::connect(&url()).await.unwrap();
    view.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .await
        .unwrap();
    sqlx::query(&format!("SELECT COUNT(*) FROM {}", table(&store, "events")))
        .execute(&mut view)
        .await
        .unwrap();
    let events: Vec<_> = (0..300)
        .map(|i| event(&format!("k{}", i % 30), i))
        .collect();
    OutboxWriter::enqueue(&store, &events).await.unwrap();
    assert_eq!(drain(&store, 40).await.len(), 300);
    let last: i64 = sqlx::query_scalar(&format!(
        "SELECT MAX(sequence) FROM {}",
        table(&store, "events")
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    let (scan_from, flight_from) = floors(&store).await;
    assert!(
        scan_from > last && flight_from > last,
        "claims still read from {scan_from} (pending) and {flight_from} (in flight), \
         behind the 300 published rows up to {last}"
    );
    let next = event("k0", 300);
    OutboxWriter::enqueue(&store, std::slice::from_ref(&next))
        .await
        .unwrap();
    assert_eq!(claim_ids(&store, 10).await, vec![next.event_id]);
    view.execute("ROLLBACK").await.unwrap();
}

/// The floor stops a second at a sequence whose insert has not committed,
/// then passes it; the scan from the start once a second still finds the
/// row when it commits.
#[tokio::test]
async fn a_commit_later_than_a_second_is_found_by_the_scan_from_the_start() {
    let clock = ManualClock::at_epoch();
    let store = store_on(clock.clone()).await;
    let (early, late) = (event("a", 1), event("b", 2));
    let mut open = store.pool().begin().await.unwrap();
    store
        .enqueue(&mut open, std::slice::from_ref(&early))
        .await
        .unwrap();
    OutboxWriter::enqueue(&store, std::slice::from_ref(&late))
        .await
        .unwrap();
    assert_eq!(drain(&store, 10).await, vec![late.event_id]);
    clock.advance(Duration::from_secs(2));
    assert!(drain(&store, 10).await.is_empty());
    assert!(
        floors(&store).await.0 > 2,
        "the floor passed the open insert after a second"
    );
    open.commit().await.unwrap();
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        drain(&store, 10).await,
        vec![early.event_id],
        "the late commit is published"
    );
}

/// A head taken back to pending sits below the floor (the claim after its
/// lease moved the floor to its key's next row): the nack or release lowers
/// the floor, so the key's next row never goes before it.
async fn head_goes_first_again_after(settle: &str) {
    let clock = ManualClock::at_epoch();
    let store = store_on(clock.clone()).await;
    let events: Vec<_> = (0..4).map(|i| event("a", i)).collect();
    OutboxWriter::enqueue(&store, &events).await.unwrap();
    let batch = store
        .claim_batch(&store_suite::request("r", 1))
        .await
        .unwrap();
    let head = batch.events[0].lease.clone();
    assert_eq!(head.event_id, events[0].event_id);
    assert!(
        claim_ids(&store, 10).await.is_empty(),
        "the key is in flight"
    );
    assert!(
        floors(&store).await.0 > head.sequence,
        "the floor moved past the head in flight"
    );
    if settle == "retry" {
        let nack = Nack {
            lease: head,
            action: NackAction::Retry {
                after: Duration::ZERO,
            },
            error_class: ErrorClass::Transient,
            error: "timed out".into(),
        };
        store.nack(&[nack]).await.unwrap();
    } else {
        let release = Release {
            lease: head,
            attempt_started: false,
        };
        store.release(&[release]).await.unwrap();
    }
    clock.advance(Duration::from_millis(10));
    assert_eq!(
        claim_ids(&store, 10).await,
        events.iter().map(|e| e.event_id).collect::<Vec<_>>(),
        "after a {settle}, the key's head goes first again"
    );
}

#[tokio::test]
async fn a_retried_head_below_the_floor_goes_first_again() {
    head_goes_first_again_after("retry").await;
}

#[tokio::test]
async fn a_released_head_below_the_floor_goes_first_again() {
    head_goes_first_again_after("release").await;
}

/// A truncated events table numbers its rows from 1 again, below the
/// floors: the claim sees another row where the last one was and reads
/// from the start, in order.
#[tokio::test]
async fn after_a_truncate_claims_read_from_the_start_in_order() {
    let store = store_on(ManualClock::at_epoch()).await;
    let before: Vec<_> = (0..3).map(|i| event("a", i)).collect();
    OutboxWriter::enqueue(&store, &before).await.unwrap();
    assert_eq!(drain(&store, 10).await.len(), 3);
    sqlx::query(&format!("TRUNCATE TABLE {}", table(&store, "events")))
        .execute(store.pool())
        .await
        .unwrap();
    let after: Vec<_> = (0..6).map(|i| event("k", i)).collect();
    OutboxWriter::enqueue(&store, &after).await.unwrap();
    assert_eq!(
        claim_ids(&store, 10).await,
        after.iter().map(|e| e.event_id).collect::<Vec<_>>(),
        "every row of the key, from its first"
    );
}
