//! Where claims start reading the rows in flight (the claim-turn row's
//! `flight_from`), with a read view held: InnoDB keeps every index entry an
//! ack delete-marks while any session's view is open, and a claim that
//! read from the start of the in-flight range stepped over all of them.
//! These pin the floor moving, and what must stay true around it: a late
//! commit, a retry, a release and a truncated table keep each key's order.

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

/// The claim-turn row's `flight_from`.
async fn flight_from(store: &MySqlStore) -> i64 {
    let turn = table(store, "claim_lock");
    sqlx::query_scalar(&format!("SELECT flight_from FROM {turn} WHERE id = 1"))
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
    store_suite::drain_as(store, &store_suite::request("r", limit)).await
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
    let from = flight_from(&store).await;
    assert!(
        from > last,
        "claims still read the rows in flight from {from}, behind the 300 published rows up to {last}"
    );
    let next = event("k0", 300);
    OutboxWriter::enqueue(&store, std::slice::from_ref(&next))
        .await
        .unwrap();
    assert_eq!(claim_ids(&store, 10).await, vec![next.event_id]);
    view.execute("ROLLBACK").await.unwrap();
}

/// An insert that commits late, however late: its row goes before the
/// key's next one, which another writer enqueues at once.
#[tokio::test]
async fn a_late_commit_goes_before_its_keys_next_row_however_late() {
    let clock = ManualClock::at_epoch();
    let store = store_on(clock.clone()).await;
    let (early, other, next) = (event("a", 1), event("b", 2), event("a", 3));
    let mut open = store.pool().begin().await.unwrap();
    store
        .enqueue(&mut open, std::slice::from_ref(&early))
        .await
        .unwrap();
    OutboxWriter::enqueue(&store, std::slice::from_ref(&other))
        .await
        .unwrap();
    assert_eq!(drain(&store, 10).await, vec![other.event_id]);
    // Claims go on past the open insert's second.
    clock.advance(Duration::from_millis(700));
    assert!(drain(&store, 10).await.is_empty());
    clock.advance(Duration::from_millis(700));
    assert!(drain(&store, 10).await.is_empty());
    open.commit().await.unwrap();
    OutboxWriter::enqueue(&store, std::slice::from_ref(&next))
        .await
        .unwrap();
    assert_eq!(
        claim_ids(&store, 10).await,
        vec![early.event_id, next.event_id],
        "the late commit first, then its key's next row"
    );
}

/// A head taken back to pending goes first again (the floor in flight has
/// moved past it): its key's next row never goes before it.
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
async fn a_retried_head_goes_first_again() {
    head_goes_first_again_after("retry").await;
}

#[tokio::test]
async fn a_released_head_goes_first_again() {
    head_goes_first_again_after("release").await;
}

/// A truncated events table numbers its rows from 1 again, below the
/// floor in flight: the claims lease them in order, and keep the key in
/// flight while they are.
#[tokio::test]
async fn after_a_truncate_rows_leased_below_the_old_floor_keep_their_key_in_flight() {
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
    let batch = store
        .claim_batch(&store_suite::request("r", 2))
        .await
        .unwrap();
    let first: Vec<_> = batch.events.iter().map(|c| c.event.event_id).collect();
    assert_eq!(first, vec![after[0].event_id, after[1].event_id]);
    assert!(
        claim_ids(&store, 10).await.is_empty(),
        "the key is in flight below the old floor"
    );
}
