//! A lease's owner lives in one record per claim (`outbox_lease_owners`),
//! not in each leased row: the rows a lease rewrites keep their size, so
//! InnoDB updates them in place. These tests pin what that must not cost:
//! the records stay few, an owner is known while its lease is in flight,
//! and rows leased by an earlier release (owner in the row, no record)
//! still name theirs.

use std::time::Duration;

use outbox_core::store::{
    EventState, FailReason, Nack, NackAction, OutboxAdmin, OutboxStore, Release,
};
use outbox_core::testing::{event, store_suite};
use outbox_core::{ErrorClass, ManualClock, OutboxWriter};
use outbox_sqlx::mysql::MySqlStore;

/// `table` beside the store's events table (same database and prefix).
fn beside_events(store: &MySqlStore, table: &str) -> String {
    let events = store.config().tables.events();
    format!("{}{table}", events.strip_suffix("events").unwrap())
}

async fn scalar(store: &MySqlStore, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Sixty claims and acks by one relay while another's lease stays in
/// flight: the records of finished leases are removed as claims go on
/// (at most one forgetting interval of them is left), and the record of
/// the lease in flight is kept, so its owner is still reported.
#[tokio::test]
async fn owner_records_stay_few_and_a_lease_in_flight_keeps_its_owner() {
    let store = super::store_on(ManualClock::at_epoch()).await;
    let owners = beside_events(&store, "lease_owners");
    let held_event = event("held", 0);
    OutboxWriter::enqueue(&store, std::slice::from_ref(&held_event))
        .await
        .unwrap();
    let held = store
        .claim_batch(&store_suite::request("r-held", 1))
        .await
        .unwrap()
        .events;
    assert_eq!(held.len(), 1);
    for n in 0..60 {
        OutboxWriter::enqueue(&store, &[event(&format!("k{n}"), n)])
            .await
            .unwrap();
        let claimed = store
            .claim_batch(&store_suite::request("r-busy", 10))
            .await
            .unwrap()
            .events;
        assert_eq!(claimed.len(), 1, "claim {n}");
        let leases: Vec<_> = claimed.into_iter().map(|c| c.lease).collect();
        store.ack(&leases).await.unwrap();
    }
    let records = scalar(&store, &format!("SELECT COUNT(*) FROM {owners}")).await;
    let most = outbox_sql::mysql::FORGET_OWNERS_EVERY as i64 + 1;
    assert!(
        (1..=most).contains(&records),
        "{records} owner records after 61 claims (at most {most})"
    );
    match store.event_state(held_event.event_id).await.unwrap() {
        Some(EventState::InFlight { owner, .. }) => assert_eq!(owner, "r-held"),
        other => panic!("the held event is not in flight: {other:?}"),
    }
}

/// A lease names its owner in its record only: the leased row's own
/// owner column stays NULL; `lease_expires_at` starts at 0 and
/// `published_at` at -1, and the ack leaves the lease's expiry: so neither
/// the lease nor the ack changes a column's size (InnoDB rewrites the row
/// in place instead of moving it).
#[tokio::test]
async fn a_lease_and_its_ack_change_no_columns_size() {
    let store = super::store_on(ManualClock::at_epoch()).await;
    let events = store.config().tables.events();
    let e = event("k", 1);
    OutboxWriter::enqueue(&store, std::slice::from_ref(&e))
        .await
        .unwrap();
    let sizes_kept = |published: &str| {
        format!(
            "SELECT COUNT(*) FROM {events}
             WHERE event_id = '{}' AND lease_owner IS NULL AND lease_expires_at IS NOT NULL
               AND published_at {published}",
            e.event_id
        )
    };
    assert_eq!(scalar(&store, &sizes_kept("= -1")).await, 1, "as enqueued");
    let claimed = store
        .claim_batch(&store_suite::request("r", 1))
        .await
        .unwrap()
        .events;
    assert_eq!(claimed.len(), 1);
    assert_eq!(scalar(&store, &sizes_kept("= -1")).await, 1, "as leased");
    store.ack(&[claimed[0].lease.clone()]).await.unwrap();
    assert_eq!(scalar(&store, &sizes_kept(">= 0")).await, 1, "as acked");
    assert!(matches!(
        store.event_state(e.event_id).await.unwrap(),
        Some(EventState::Published { .. })
    ));
}

/// Rows that go back to pending (a retry, a release, a started release)
/// or fail keep an expiry of 0, as enqueued, not NULL: their next lease
/// rewrites them in place too.
#[tokio::test]
async fn rows_that_go_back_or_fail_keep_their_columns_size() {
    let store = super::store_on(ManualClock::at_epoch()).await;
    let events = store.config().tables.events();
    let batch: Vec<_> = ["a", "b", "c", "d"].iter().map(|k| event(k, 1)).collect();
    OutboxWriter::enqueue(&store, &batch).await.unwrap();
    let claimed = store
        .claim_batch(&store_suite::request("r", 4))
        .await
        .unwrap()
        .events;
    assert_eq!(claimed.len(), 4);
    let lease = |n: usize| claimed[n].lease.clone();
    let nack = |n: usize, action| Nack {
        lease: lease(n),
        action,
        error_class: ErrorClass::Transient,
        error: "broker said no".into(),
    };
    let retry = NackAction::Retry {
        after: Duration::from_secs(1),
    };
    let fail = NackAction::Fail {
        reason: FailReason::Permanent,
        block_key: false,
    };
    store.nack(&[nack(0, retry), nack(1, fail)]).await.unwrap();
    store
        .release(&[
            Release {
                lease: lease(2),
                attempt_started: false,
            },
            Release {
                lease: lease(3),
                attempt_started: true,
            },
        ])
        .await
        .unwrap();
    let by_status = format!(
        "SELECT COUNT(*) FROM {events}
         WHERE lease_expires_at = 0 AND published_at = -1 AND status IN (0, 3)"
    );
    assert_eq!(scalar(&store, &by_status).await, 4);
}

/// Rows whose lease a dead relay left to expire go back with an expiry of
/// 0 too: the reaping claim leases one of them (a batch of one), the other
/// waits as reaped.
#[tokio::test]
async fn rows_reaped_from_a_dead_lease_keep_their_columns_size() {
    let clock = ManualClock::at_epoch();
    let store = super::store_on(clock.clone()).await;
    let events = store.config().tables.events();
    OutboxWriter::enqueue(&store, &[event("e", 1), event("f", 1)])
        .await
        .unwrap();
    let dead = store
        .claim_batch(&store_suite::request("r-dead", 2))
        .await
        .unwrap()
        .events;
    assert_eq!(dead.len(), 2);
    clock.advance(Duration::from_secs(3_600));
    store
        .claim_batch(&store_suite::request("r-next", 1))
        .await
        .unwrap();
    let reaped = |expiry: &str| {
        format!("SELECT COUNT(*) FROM {events} WHERE status = 0 AND lease_expires_at {expiry}")
    };
    assert_eq!(scalar(&store, &reaped("IS NOT NULL")).await, 1, "one waits");
    assert_eq!(scalar(&store, &reaped("= 0")).await, 1);
}

/// Rows leased by an earlier release name their owner in the row and have
/// no record: the owner is still reported while in flight and is the
/// actor of a nack's history entry.
#[tokio::test]
async fn rows_leased_by_an_earlier_release_keep_their_owner() {
    let store = super::store_on(ManualClock::at_epoch()).await;
    let events = store.config().tables.events();
    let owners = beside_events(&store, "lease_owners");
    let e = event("k", 1);
    OutboxWriter::enqueue(&store, std::slice::from_ref(&e))
        .await
        .unwrap();
    let claimed = store
        .claim_batch(&store_suite::request("r-now", 1))
        .await
        .unwrap()
        .events;
    // As the earlier release leaves it: the owner in the row, no record.
    sqlx::query(&format!(
        "UPDATE {events} SET lease_owner = 'r-earlier' WHERE event_id = ?"
    ))
    .bind(e.event_id.to_string())
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::query(&format!("DELETE FROM {owners}"))
        .execute(store.pool())
        .await
        .unwrap();
    match store.event_state(e.event_id).await.unwrap() {
        Some(EventState::InFlight { owner, .. }) => assert_eq!(owner, "r-earlier"),
        other => panic!("not in flight: {other:?}"),
    }
    let nack = Nack {
        lease: claimed[0].lease.clone(),
        action: NackAction::Retry {
            after: Duration::from_secs(1),
        },
        error_class: ErrorClass::Transient,
        error: "broker said no".into(),
    };
    store.nack(&[nack]).await.unwrap();
    let history = store.history(e.event_id).await.unwrap();
    let last = history.last().expect("a history entry for the nack");
    assert_eq!(last.actor, "r-earlier", "{history:?}");
}

/// Tables made by an earlier release left `lease_expires_at` and
/// `published_at` NULL by default, so a row another tool inserted grew at
/// its first lease and again at its ack. `migrate()` sets the current
/// defaults (and does nothing once they match).
#[tokio::test]
async fn migrate_sets_the_defaults_that_keep_rows_their_size() {
    let store = super::store_on(ManualClock::at_epoch()).await;
    let events = store.config().tables.events();
    let (database, table) = events.split_once('.').unwrap();
    let defaults = || async {
        let rows: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT column_name, column_default FROM information_schema.columns
             WHERE table_schema = ? AND table_name = ?
               AND column_name IN ('lease_expires_at', 'published_at') ORDER BY column_name",
        )
        .bind(database)
        .bind(table)
        .fetch_all(store.pool())
        .await
        .unwrap();
        rows.into_iter()
            .map(|(column, default)| format!("{column}={}", default.unwrap_or_default()))
            .collect::<Vec<_>>()
    };
    let current = vec!["lease_expires_at=0", "published_at=-1"];
    assert_eq!(defaults().await, current);
    sqlx::query(&format!(
        "ALTER TABLE {events} ALTER COLUMN lease_expires_at SET DEFAULT NULL,
             ALTER COLUMN published_at SET DEFAULT NULL"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    assert_ne!(defaults().await, current);
    store.migrate().await.unwrap();
    assert_eq!(defaults().await, current);
    store.migrate().await.expect("migrate() is idempotent");
    assert_eq!(defaults().await, current);

    // A row another tool inserts naming neither column takes them.
    sqlx::query(&format!(
        "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type, partition_key,
                               payload, payload_version, headers, created_at, available_at)
         VALUES (UUID(), 'a', 'a-1', 't', 'foreign', '{{}}', 1, '{{}}', 0, 0)"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let (expiry, published): (Option<i64>, Option<i64>) = sqlx::query_as(&format!(
        "SELECT lease_expires_at, published_at FROM {events} WHERE partition_key = 'foreign'"
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!((expiry, published), (Some(0), Some(-1)));
}
