//! The core's conformance suites and SQLite-specific checks, on database
//! files of their own under the system temp directory.
#![cfg(feature = "sqlite")]

#[path = "sqlite/parked.rs"]
mod parked;
mod support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use outbox_core::store::{
    EnqueueOutcome, EventState, Heartbeat, OutboxAdmin, PublisherOutage, RelayId,
};
use outbox_core::testing::{InboxHarness, event, event_with_payload, store_suite};
use outbox_core::{EventId, ManualClock, OutboxWriter, StoreError};
use outbox_sqlx::sqlite::{SqliteInbox, SqliteStore};
use outbox_sqlx::{StoreConfig, TableNames};
use sqlx::{Row, Sqlite, SqlitePool, Transaction};

fn db_path() -> String {
    std::env::temp_dir()
        .join(format!("{}.db", support::unique_name("outbox")))
        .to_string_lossy()
        .into_owned()
}

async fn store_on(clock: ManualClock) -> SqliteStore {
    let config = StoreConfig::default()
        .with_clock(Arc::new(clock.clone()))
        .with_time(outbox_core::StoreTime::Shifted(clock));
    let store = SqliteStore::open(&db_path(), config).await.unwrap();
    store.migrate().await.unwrap();
    store
}

fn sqlite_store(clock: ManualClock) -> BoxFuture<'static, Arc<SqliteStore>> {
    Box::pin(async move { Arc::new(store_on(clock).await) })
}

mod store {
    outbox_core::store_conformance_tests!(super::sqlite_store);
}

/// SQLite has one writer at a time: the suite's overlapping-writer tests
/// skip themselves (and the commit-order ones, which need two open
/// writers, do not apply: insert order is commit order).
mod failure {
    outbox_core::failure_conformance_tests!(super::sqlite_store);
}

mod relay {
    outbox_core::relay_conformance_tests!(super::sqlite_store);
}

struct SqliteInboxHarness {
    inbox: SqliteInbox,
    pool: SqlitePool,
    clock: ManualClock,
}

#[async_trait]
impl InboxHarness for SqliteInboxHarness {
    type Inbox = SqliteInbox;
    fn inbox(&self) -> &SqliteInbox {
        &self.inbox
    }
    async fn apply_effect(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        consumer: &str,
        event_id: EventId,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO effects (consumer, event_id) VALUES (?1, ?2)")
            .bind(consumer)
            .bind(event_id.to_string())
            .execute(&mut **tx)
            .await
            .map_err(StoreError::fatal)?;
        Ok(())
    }
    async fn effects(&self, consumer: &str) -> Result<Vec<EventId>, StoreError> {
        let rows = sqlx::query("SELECT event_id FROM effects WHERE consumer = ?1 ORDER BY seq")
            .bind(consumer)
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::fatal)?;
        Ok(rows
            .iter()
            .map(|r| r.get::<String, _>("event_id").parse().unwrap())
            .collect())
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

fn sqlite_inbox(clock: ManualClock) -> BoxFuture<'static, Arc<SqliteInboxHarness>> {
    Box::pin(async move {
        let store = store_on(clock.clone()).await;
        sqlx::query(
            "CREATE TABLE effects (seq INTEGER PRIMARY KEY AUTOINCREMENT, consumer TEXT NOT NULL, event_id TEXT NOT NULL)",
        )
        .execute(store.pool())
        .await
        .unwrap();
        Arc::new(SqliteInboxHarness {
            inbox: store.inbox(),
            pool: store.pool().clone(),
            clock,
        })
    })
}

mod inbox {
    outbox_core::inbox_conformance_tests!(super::sqlite_inbox);
}

#[tokio::test]
async fn payload_text_is_kept_byte_for_byte() {
    let store = store_on(ManualClock::at_epoch()).await;
    let mut e = event("a", 1);
    e.payload = outbox_core::Payload::from_json_text(r#"{ "z": 1,  "a": "\u0000 kept" }"#).unwrap();
    OutboxWriter::enqueue(&store, std::slice::from_ref(&e))
        .await
        .unwrap();
    let claimed = outbox_core::OutboxStore::claim_batch(
        &store,
        &outbox_core::testing::store_suite::request("r", 1),
    )
    .await
    .unwrap();
    assert_eq!(claimed.events[0].event.payload, e.payload);
}

#[tokio::test]
async fn enqueue_joins_the_callers_transaction() {
    let store = store_on(ManualClock::at_epoch()).await;
    let (kept, dropped) = (event("a", 1), event("a", 2));
    let mut tx = store.begin_immediate().await.unwrap();
    store
        .enqueue(&mut tx, std::slice::from_ref(&dropped))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = store.begin_immediate().await.unwrap();
    store
        .enqueue(&mut tx, std::slice::from_ref(&kept))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.event_state(dropped.event_id).await.unwrap(), None);
    assert!(matches!(
        store.event_state(kept.event_id).await.unwrap(),
        Some(EventState::Pending { .. })
    ));
}

/// Commit order is sequence order: while one writer is open, no other can
/// even begin (a connection that will not wait is refused with SQLITE_BUSY),
/// so no later sequence can commit before an earlier one.
#[tokio::test]
async fn writers_are_serialised() {
    use sqlx::Connection;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
    use std::str::FromStr;

    let path = db_path();
    let store = SqliteStore::open(&path, StoreConfig::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let impatient = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))
        .unwrap()
        .busy_timeout(Duration::ZERO);
    let mut other = SqliteConnection::connect_with(&impatient).await.unwrap();

    let mut first = store.begin_immediate().await.unwrap();
    store.enqueue(&mut first, &[event("a", 1)]).await.unwrap();
    let refused = sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap_err();
    let code = refused
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert_eq!(
        code.as_deref(),
        Some("5"),
        "SQLITE_BUSY while a writer is open: {refused}"
    );
    first.commit().await.unwrap();

    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    let outcome = OutboxWriter::enqueue(&store, &[event("a", 2)])
        .await
        .unwrap();
    assert!(matches!(
        outcome[0],
        EnqueueOutcome::Inserted { sequence: 2 }
    ));
}

#[tokio::test]
async fn bulk_enqueue_of_forty_thousand_is_one_statement() {
    let store = store_on(ManualClock::at_epoch()).await;
    let events: Vec<_> = (0..40_000)
        .map(|n| event_with_payload(&format!("k{}", n % 1000), n, serde_json::json!({"n": n})))
        .collect();
    let outcomes = OutboxWriter::enqueue(&store, &events).await.unwrap();
    assert_eq!(outcomes.len(), 40_000);
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, EnqueueOutcome::Inserted { .. }))
    );
}

#[tokio::test]
async fn a_schema_is_refused() {
    let pool = SqlitePool::connect("sqlite::memory:").await.unwrap();
    let tables = TableNames::default().in_schema("app").unwrap();
    let err = SqliteStore::new(pool, StoreConfig::with_tables(tables)).unwrap_err();
    assert!(matches!(err, StoreError::Config(_)));
}

#[tokio::test]
async fn shipped_migration_is_the_default_rendering() {
    let pool = SqlitePool::connect("sqlite::memory:").await.unwrap();
    let store = SqliteStore::new(pool, StoreConfig::default()).unwrap();
    assert_eq!(
        include_str!("../migrations/sqlite/0001_outbox.sql"),
        store.schema_sql()
    );
}

/// Tables made before a column was added (the crash suspects' span) get it
/// from `migrate()`, which stays idempotent, and claims work on them.
#[tokio::test]
async fn migrate_adds_the_columns_older_tables_lack() {
    use outbox_core::store::OutboxStore;
    let store = store_on(ManualClock::at_epoch()).await;
    let events = store.config().tables.events();
    let columns = |pool: SqlitePool, events: String| async move {
        sqlx::query_scalar::<_, String>("SELECT name FROM pragma_table_info(?1)")
            .bind(events)
            .fetch_all(&pool)
            .await
            .unwrap()
    };
    sqlx::query(&format!("ALTER TABLE {events} DROP COLUMN suspect_span"))
        .execute(store.pool())
        .await
        .unwrap();
    // The relays table as releases before the outage columns made it.
    let relays = store.config().tables.relays();
    sqlx::raw_sql(&format!(
        "DROP TABLE {relays};
         CREATE TABLE {relays} (relay TEXT PRIMARY KEY, last_seen INTEGER NOT NULL,
             clock_skew_ms INTEGER NOT NULL DEFAULT 0);"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    assert!(
        !columns(store.pool().clone(), events.clone())
            .await
            .contains(&"suspect_span".to_string())
    );
    store.migrate().await.unwrap();
    store.migrate().await.expect("migrate() is idempotent");
    assert!(
        columns(store.pool().clone(), events.clone())
            .await
            .contains(&"suspect_span".to_string())
    );
    OutboxWriter::enqueue(&store, &[event("a", 1)])
        .await
        .unwrap();
    let batch = store
        .claim_batch(&store_suite::request("relay", 10))
        .await
        .unwrap();
    assert_eq!(batch.events.len(), 1);
    let outage_columns = columns(store.pool().clone(), relays)
        .await
        .into_iter()
        .filter(|c| c.starts_with("outage_"))
        .count();
    assert_eq!(
        outage_columns, 3,
        "migrate() adds the relays' outage columns"
    );
    store
        .heartbeat(&Heartbeat::in_outage(
            RelayId::new("relay"),
            PublisherOutage::new("kafka", "down"),
        ))
        .await
        .expect("heartbeat after migrate");
}

/// Two stores with pools of their own on one file behave like two processes:
/// claims stay exclusive and a stale acknowledgement is fenced off.
#[tokio::test]
async fn leases_and_fencing_hold_across_processes_sharing_the_file() {
    use outbox_core::store::OutboxStore;
    let path = db_path();
    let clock = ManualClock::at_epoch();
    let open = || {
        SqliteStore::open(
            &path,
            StoreConfig::default()
                .with_clock(Arc::new(clock.clone()))
                .with_time(outbox_core::StoreTime::Shifted(clock.clone())),
        )
    };
    let first = Arc::new(open().await.unwrap());
    first.migrate().await.unwrap();
    let second = Arc::new(open().await.unwrap());

    let events: Vec<_> = (0..200).map(|n| event(&format!("k{n}"), n)).collect();
    OutboxWriter::enqueue(&*first, &events).await.unwrap();
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let store = if worker % 2 == 0 {
            first.clone()
        } else {
            second.clone()
        };
        tasks.push(tokio::spawn(async move {
            let request = store_suite::request(&format!("proc-{worker}"), 7);
            let mut mine = Vec::new();
            loop {
                let batch = store.claim_batch(&request).await.unwrap().events;
                if batch.is_empty() {
                    return mine;
                }
                let leases: Vec<_> = batch.iter().map(|c| c.lease.clone()).collect();
                assert_eq!(store.ack(&leases).await.unwrap().applied, leases.len());
                mine.extend(batch.into_iter().map(|c| c.event.event_id));
            }
        }));
    }
    let mut seen = std::collections::HashSet::new();
    for task in tasks {
        for id in task.await.unwrap() {
            assert!(seen.insert(id), "{id} claimed by two processes");
        }
    }
    assert_eq!(seen.len(), 200);

    let late = event("fence", 1);
    OutboxWriter::enqueue(&*first, std::slice::from_ref(&late))
        .await
        .unwrap();
    let stale = first
        .claim_batch(&store_suite::request("proc-a", 1))
        .await
        .unwrap()
        .events;
    clock.advance(store_suite::LEASE + Duration::from_secs(1));
    let fresh = second
        .claim_batch(&store_suite::request("proc-b", 1))
        .await
        .unwrap()
        .events;
    assert_eq!(fresh[0].event.event_id, late.event_id);
    let report = first.ack(&[stale[0].lease.clone()]).await.unwrap();
    assert_eq!(report.fenced, vec![late.event_id]);
    assert_eq!(
        second.ack(&[fresh[0].lease.clone()]).await.unwrap().applied,
        1
    );
}

/// A relay over a database file whose tables were never migrated stops by
/// itself with the store's error (DESIGN.md §6).
#[tokio::test]
async fn a_relay_over_tables_never_migrated_stops_with_the_error() {
    let store = SqliteStore::open(&db_path(), StoreConfig::default())
        .await
        .unwrap();
    outbox_core::testing::relay_suite::stops_on_a_store_that_cannot_work(
        Arc::new(store),
        "run migrate()",
    )
    .await;
}

/// A driver error names the store operation and its table, and its
/// message is said once (not again as the error's source).
#[tokio::test]
async fn driver_errors_name_the_operation_and_table_once() {
    let store = store_on(ManualClock::at_epoch()).await;
    store.pool().close().await;
    support::assert_closed_pool_errors_name_their_operation(
        &store,
        &store.inbox(),
        &store.config().tables.events(),
        &store.config().tables.inbox(),
    )
    .await;
}

/// The plan of a claim's candidate query, one line per step.
async fn claim_plan(store: &SqliteStore, ordering: outbox_core::Ordering) -> String {
    let explain = format!("EXPLAIN QUERY PLAN {}", store.claim_statement(ordering));
    let rows = sqlx::query(&explain)
        .bind(i64::MAX)
        .bind(256_i64)
        .fetch_all(store.pool())
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.get::<String, _>("detail"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A claim reads pending rows in claim order from the live index and stops
/// at its limit. It once read the whole backlog through another index and
/// sorted it, every claim (SQLite takes a partial index only for a WHERE
/// that repeats its condition): a claim's cost grew with the backlog.
/// Checked with and without `ANALYZE` statistics, as users may run it.
#[tokio::test]
async fn claims_read_the_live_index_in_order_and_never_sort_the_backlog() {
    let store = store_on(ManualClock::at_epoch()).await;
    let events: Vec<_> = (0..2_000)
        .map(|i| event(&format!("k{}", i % 10), i))
        .collect();
    OutboxWriter::enqueue(&store, &events).await.unwrap();
    for analyzed in [false, true] {
        if analyzed {
            sqlx::query("ANALYZE").execute(store.pool()).await.unwrap();
        }
        for ordering in [
            outbox_core::Ordering::PerKey,
            outbox_core::Ordering::Unordered,
        ] {
            let plan = claim_plan(&store, ordering).await;
            let first = plan.lines().next().unwrap_or_default();
            assert!(
                first.starts_with("SCAN c USING INDEX outbox_events_live"),
                "{ordering:?} (analyzed: {analyzed}) must scan the live index:\n{plan}"
            );
            assert!(
                !plan.contains("TEMP B-TREE"),
                "{ordering:?} (analyzed: {analyzed}) must not sort:\n{plan}"
            );
            // The blocking probe reads the key's blocking rows alone, not
            // every live row of the key.
            if ordering == outbox_core::Ordering::PerKey {
                assert!(
                    plan.contains("USING INDEX outbox_events_key_blocking"),
                    "the blocking probe reads its own index (analyzed: {analyzed}):\n{plan}"
                );
            }
        }
    }
}

/// migrate() on current tables, three instances at once, while a report
/// holds a read transaction: every migrate() returns and an enqueue beside
/// them commits promptly (WAL: readers never block the writer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_on_current_tables_takes_no_lock_producers_queue_behind() {
    let store = store_on(ManualClock::at_epoch()).await;
    let events = store.config().tables.events();
    support::warm(store.pool(), 6).await;
    let mut report = store.pool().begin().await.unwrap();
    sqlx::query(&format!("SELECT COUNT(*) FROM {events}"))
        .fetch_one(&mut *report)
        .await
        .unwrap();
    support::three_deploys_beside_a_producer(
        || {
            let store = store.clone();
            async move { store.migrate().await }
        },
        || async {
            OutboxWriter::enqueue(&store, &[event("a", 1)])
                .await
                .map(drop)
        },
    )
    .await;
    report.rollback().await.unwrap();
}
