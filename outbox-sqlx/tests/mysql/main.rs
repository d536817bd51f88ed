//! The core's conformance suites and MySQL-specific checks, against a live
//! MariaDB/MySQL (`OUTBOX_MYSQL_URL`, default root on loopback), one
//! database per test.
#![cfg(feature = "mysql")]

#[path = "../mysql_floor/mod.rs"]
mod floor;
mod lease_owners;
mod parked;
#[path = "../support/mod.rs"]
mod support;
mod tenants;

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use outbox_core::store::{
    ClaimedBatch, EnqueueOutcome, Heartbeat, OutboxAdmin, OutboxStore, PublisherOutage, RelayId,
};
use outbox_core::testing::{InboxHarness, event, store_suite};
use outbox_core::{EventId, ManualClock, OutboxWriter, StoreError};
use outbox_sqlx::mysql::{MySqlInbox, MySqlStore};
use outbox_sqlx::{StoreConfig, TableNames};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{MySql, Row, Transaction};

fn url() -> String {
    std::env::var("OUTBOX_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

async fn pool() -> MySqlPool {
    let url = url();
    match outbox_sqlx::guard_cancelled_transactions(MySqlPoolOptions::new())
        .max_connections(10)
        .connect(&url)
        .await
    {
        Ok(pool) => pool,
        Err(e) => support::unreachable("MySQL/MariaDB", &url, e),
    }
}

async fn store_on(clock: ManualClock) -> MySqlStore {
    let pool = pool().await;
    let database = support::unique_name("outbox_t");
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&pool)
        .await
        .unwrap();
    let tables = TableNames::default().in_schema(&database).unwrap();
    let store = MySqlStore::new(
        pool,
        StoreConfig::with_tables(tables)
            .with_clock(Arc::new(clock.clone()))
            .with_time(outbox_core::StoreTime::Shifted(clock)),
    );
    store.migrate().await.unwrap();
    store
}

fn mysql_store(clock: ManualClock) -> BoxFuture<'static, Arc<MySqlStore>> {
    Box::pin(async move { Arc::new(store_on(clock).await) })
}

mod store {
    outbox_core::store_conformance_tests!(super::mysql_store);
    outbox_core::commit_order_conformance_tests!(super::mysql_store);
}

mod relay {
    outbox_core::relay_conformance_tests!(super::mysql_store);
}

mod failure {
    outbox_core::failure_conformance_tests!(super::mysql_store);
}

struct MySqlInboxHarness {
    inbox: MySqlInbox,
    pool: MySqlPool,
    effects: String,
    clock: ManualClock,
}

#[async_trait]
impl InboxHarness for MySqlInboxHarness {
    type Inbox = MySqlInbox;
    fn inbox(&self) -> &MySqlInbox {
        &self.inbox
    }
    async fn apply_effect(
        &self,
        tx: &mut Transaction<'static, MySql>,
        consumer: &str,
        event_id: EventId,
    ) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "INSERT INTO {} (consumer, event_id) VALUES (?, ?)",
            self.effects
        ))
        .bind(consumer)
        .bind(event_id.to_string())
        .execute(&mut **tx)
        .await
        .map_err(StoreError::fatal)?;
        Ok(())
    }
    async fn effects(&self, consumer: &str) -> Result<Vec<EventId>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT event_id FROM {} WHERE consumer = ? ORDER BY seq",
            self.effects
        ))
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

fn mysql_inbox(clock: ManualClock) -> BoxFuture<'static, Arc<MySqlInboxHarness>> {
    Box::pin(async move {
        let store = store_on(clock.clone()).await;
        let database: String = {
            let sql = store.schema_sql();
            let start = sql.find("CREATE TABLE IF NOT EXISTS ").unwrap() + 27;
            sql[start..].split('.').next().unwrap().to_owned()
        };
        let effects = format!("{database}.effects");
        sqlx::query(&format!(
            "CREATE TABLE {effects} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, consumer VARCHAR(255) NOT NULL, event_id CHAR(36) NOT NULL)"
        ))
        .execute(store.pool())
        .await
        .unwrap();
        Arc::new(MySqlInboxHarness {
            inbox: store.inbox(),
            pool: store.pool().clone(),
            effects,
            clock,
        })
    })
}

mod inbox {
    outbox_core::inbox_conformance_tests!(super::mysql_inbox);
}

/// Two writers of one key: the second waits on the key's row lock until the
/// first commits, so its row can never be claimed ahead of the first's.
#[tokio::test]
async fn writers_of_one_key_take_turns() {
    let store = store_on(ManualClock::at_epoch()).await;
    let (first, second) = (event("a", 1), event("a", 2));
    let mut early = store.pool().begin().await.unwrap();
    store
        .enqueue(&mut early, std::slice::from_ref(&first))
        .await
        .unwrap();
    let late = {
        let (store, second) = (store.clone(), second.clone());
        tokio::spawn(async move {
            let mut tx = store.pool().begin().await.unwrap();
            let outcome = store.enqueue(&mut tx, &[second]).await.unwrap();
            tx.commit().await.unwrap();
            outcome
        })
    };
    // Synchronise on the server's own view: the late writer's key upsert is
    // executing (blocked on the early writer's row lock) on this test's database.
    let database = store.schema_sql();
    let database = database
        .split("CREATE TABLE IF NOT EXISTS ")
        .nth(1)
        .and_then(|rest| rest.split('.').next())
        .unwrap()
        .to_owned();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.processlist
             WHERE info LIKE CONCAT('INSERT INTO ', ?, '.outbox_keys%')",
        )
        .bind(&database)
        .fetch_one(store.pool())
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    let claimed: ClaimedBatch = store
        .claim_batch(&store_suite::request("r", 10))
        .await
        .unwrap();
    assert!(claimed.events.is_empty(), "nothing is committed yet");
    early.commit().await.unwrap();
    let outcome = late.await.unwrap();
    assert!(matches!(outcome[0], EnqueueOutcome::Inserted { .. }));
    let claimed = store
        .claim_batch(&store_suite::request("r", 10))
        .await
        .unwrap();
    let order: Vec<_> = claimed.events.iter().map(|c| c.event.event_id).collect();
    assert_eq!(order, vec![first.event_id, second.event_id]);
}

#[tokio::test]
async fn enqueue_joins_the_callers_transaction() {
    let store = store_on(ManualClock::at_epoch()).await;
    let dropped = event("a", 2);
    let mut tx = store.pool().begin().await.unwrap();
    store
        .enqueue(&mut tx, std::slice::from_ref(&dropped))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(store.event_state(dropped.event_id).await.unwrap(), None);
}

#[tokio::test]
async fn bulk_enqueue_keeps_order_and_reports_duplicates() {
    let store = store_on(ManualClock::at_epoch()).await;
    let events: Vec<_> = (0..2000).map(|n| event("hot", n)).collect();
    let mut again = events[..10].to_vec();
    again.push(event("hot", 9999));
    let outcomes = OutboxWriter::enqueue(&store, &events).await.unwrap();
    let sequences: Vec<i64> = outcomes
        .iter()
        .map(|o| match o {
            EnqueueOutcome::Inserted { sequence } => *sequence,
            EnqueueOutcome::AlreadyExists => panic!("all new"),
        })
        .collect();
    assert!(sequences.windows(2).all(|w| w[0] < w[1]));
    let outcomes = OutboxWriter::enqueue(&store, &again).await.unwrap();
    assert!(
        outcomes[..10]
            .iter()
            .all(|o| *o == EnqueueOutcome::AlreadyExists)
    );
    assert!(matches!(outcomes[10], EnqueueOutcome::Inserted { .. }));
}

#[tokio::test]
async fn shipped_migration_is_the_default_rendering() {
    let store = MySqlStore::new(
        MySqlPoolOptions::new().connect_lazy(&url()).unwrap(),
        StoreConfig::default(),
    );
    assert_eq!(
        include_str!("../../migrations/mysql/0001_outbox.sql"),
        store.schema_sql()
    );
}

/// The events table's index definitions, name -> columns.
async fn index_columns(pool: &MySqlPool, events: &str) -> Vec<(String, String)> {
    sqlx::query_as(&format!(
        "SELECT index_name, GROUP_CONCAT(column_name ORDER BY seq_in_index SEPARATOR ', ')
         FROM information_schema.statistics
         WHERE CONCAT(table_schema, '.', table_name) = '{events}' AND index_name <> 'PRIMARY'
         GROUP BY index_name ORDER BY index_name"
    ))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Tables made by earlier releases of schema version 2 get the current
/// index definitions from `migrate()` (a `CREATE TABLE IF NOT EXISTS`
/// leaves them as they were, and the claim names its indexes): the
/// per-key due index added where it is missing, and the indexes that once
/// led with `status` (rewritten on every lease and every ack) rebuilt.
#[tokio::test]
async fn migrate_brings_older_tables_to_the_current_indexes_and_columns() {
    let store = store_on(ManualClock::at_epoch()).await;
    let events = store.config().tables.events();
    assert!(events.ends_with(".outbox_events"), "{events}");
    let current = index_columns(store.pool(), &events).await;
    sqlx::query(&format!(
        "ALTER TABLE {events} DROP INDEX outbox_events_key_due,
             DROP INDEX outbox_events_key, ADD KEY outbox_events_key (partition_key, status, sequence),
             DROP INDEX outbox_events_unfinished, ADD KEY outbox_events_unfinished (status, unfinished_claims),
             DROP INDEX outbox_events_published, ADD KEY outbox_events_published (status, published_at),
             DROP COLUMN suspect_span"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let relays = store.config().tables.relays();
    sqlx::query(&format!(
        "ALTER TABLE {relays} DROP COLUMN outage_since, DROP COLUMN outage_destination,
             DROP COLUMN outage_reason"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let older = index_columns(store.pool(), &events).await;
    assert_ne!(older, current);
    assert!(
        !older
            .iter()
            .any(|(name, _)| name == "outbox_events_key_due")
    );

    store.migrate().await.unwrap();
    assert_eq!(index_columns(store.pool(), &events).await, current);
    let (database, table) = events.split_once('.').unwrap();
    let span_columns: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.columns
         WHERE table_schema = ? AND table_name = ? AND column_name = 'suspect_span'",
    )
    .bind(database)
    .bind(table)
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(span_columns, 1, "migrate() adds the suspect_span column");
    let outage_columns: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.columns
         WHERE table_schema = ? AND table_name = ? AND column_name LIKE 'outage\\_%'",
    )
    .bind(database)
    .bind(relays.split_once('.').unwrap().1)
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(
        outage_columns, 3,
        "migrate() adds the relays' outage columns"
    );
    assert!(current.contains(&(
        "outbox_events_published".to_string(),
        "published_at".to_string()
    )));
    assert!(current.contains(&(
        "outbox_events_key".to_string(),
        "partition_key, blocks_key, sequence".to_string()
    )));
    store.migrate().await.expect("migrate() is idempotent");
    assert_eq!(index_columns(store.pool(), &events).await, current);
    // The claim names the indexes: it works again.
    OutboxWriter::enqueue(&store, &[event("a", 1)])
        .await
        .expect("enqueue after migrate");
    let batch = store
        .claim_batch(&store_suite::request("relay", 10))
        .await
        .expect("claim after migrate");
    assert_eq!(batch.events.len(), 1);
    store
        .heartbeat(&Heartbeat::in_outage(
            RelayId::new("relay"),
            PublisherOutage::new("kafka", "down"),
        ))
        .await
        .expect("heartbeat after migrate");
}

/// A per-key claim leaves out every key with a row in flight (the keys the
/// claim's reap read found), and takes back in the same claim a key whose
/// lease that reap just ended.
#[tokio::test]
async fn keys_in_flight_wait_and_a_reaped_key_returns_in_the_same_claim() {
    let clock = ManualClock::at_epoch();
    let store = store_on(clock.clone()).await;
    let keys: Vec<String> = (0..10).map(|k| format!("k{k}")).collect();
    let events: Vec<_> = (0..3)
        .flat_map(|n| keys.iter().map(move |k| event(k, n)))
        .collect();
    OutboxWriter::enqueue(&store, &events).await.unwrap();
    let key_of = |batch: &ClaimedBatch| -> Vec<String> {
        batch
            .events
            .iter()
            .map(|c| c.event.partition_key.clone())
            .collect()
    };

    let first = store
        .claim_batch(&store_suite::request("relay-a", 5))
        .await
        .unwrap();
    assert_eq!(key_of(&first), ["k0", "k1", "k2", "k3", "k4"]);
    let second = store
        .claim_batch(&store_suite::request("relay-b", 100))
        .await
        .unwrap();
    let mut taken = key_of(&second);
    taken.sort();
    let expected: Vec<String> = keys[5..]
        .iter()
        .flat_map(|k| [k.clone(), k.clone(), k.clone()])
        .collect();
    assert_eq!(taken, expected, "only keys with nothing in flight, whole");
    let leases: Vec<_> = second.events.iter().map(|c| c.lease.clone()).collect();
    store.ack(&leases).await.unwrap();

    clock.advance(store_suite::LEASE + std::time::Duration::from_secs(1));
    let third = store
        .claim_batch(&store_suite::request("relay-b", 100))
        .await
        .unwrap();
    // The expired lease's five rows came back together (a dead relay's
    // batch, crashed once): their keys' backlogs, whole, in key order.
    let mut ns: Vec<String> = third
        .events
        .iter()
        .map(|c| c.event.aggregate_id.clone())
        .collect();
    let expected: Vec<String> = keys[..5]
        .iter()
        .flat_map(|k| (0..3).map(move |n| format!("inv-{k}-{n}")))
        .collect();
    for k in &keys[..5] {
        let of_key: Vec<&String> = ns
            .iter()
            .filter(|n| n.starts_with(&format!("inv-{k}-")))
            .collect();
        let mut sorted = of_key.clone();
        sorted.sort();
        assert_eq!(of_key, sorted, "{k} in order");
    }
    ns.sort();
    assert_eq!(ns, expected);
}

/// More keys in flight than a claim statement lists: the ones past the
/// list still hold their keys back (the claim leaves their candidates out
/// as it reads them), and the statement stays under MySQL's parameter
/// limit however many leases are out.
#[tokio::test]
async fn keys_in_flight_past_the_statements_list_still_wait() {
    let store = store_on(ManualClock::at_epoch()).await;
    let busy = outbox_sql::mysql::MAX_LISTED_KEYS + 50;
    let keys: Vec<String> = (0..busy).map(|k| format!("busy-{k:05}")).collect();
    let events: Vec<_> = (0..2)
        .flat_map(|n| keys.iter().map(move |k| event(k, n)))
        .chain(std::iter::once(event("free", 0)))
        .collect();
    for chunk in events.chunks(1_000) {
        OutboxWriter::enqueue(&store, chunk).await.unwrap();
    }
    let heads = store
        .claim_batch(&store_suite::request("relay-a", busy))
        .await
        .unwrap();
    assert_eq!(heads.events.len(), busy, "every busy key's head");
    assert!(
        heads
            .events
            .iter()
            .all(|c| c.event.aggregate_id.ends_with("-0"))
    );

    let next = store
        .claim_batch(&store_suite::request("relay-b", 10_000))
        .await
        .unwrap();
    let taken: Vec<&str> = next
        .events
        .iter()
        .map(|c| c.event.partition_key.as_str())
        .collect();
    assert_eq!(taken, ["free"], "no busy key's second event");
}

mod fails_fast;

mod unreachable;

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

/// A store operation cut off at any await point (an aborted relay task, a
/// drain timeout, a `select!`) leaves no pooled connection inside a
/// transaction and none out of step with the server. Under sqlx-mysql
/// 0.8.6 a `BEGIN` cut before its answer left the server inside a
/// transaction (the next autocommit statement, the store clock's update,
/// kept its row lock), and a statement cut while being prepared left the
/// pool's release ping waiting forever on a slot of the pool; the store's
/// operations now run to completion on tasks of their own.
#[tokio::test]
async fn operations_cut_off_anywhere_leave_no_transaction_open() {
    use outbox_core::InboxStore;
    use outbox_core::testing::{cancel_at_every_await, cut_store_operations};

    let clock = ManualClock::at_epoch();
    let migrated = store_on(clock.clone()).await;
    // One connection: the one a cut operation left behind is the one
    // the check reads.
    let one = MySqlPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect(&url())
        .await
        .unwrap();
    let store = MySqlStore::new(one.clone(), migrated.config().clone());
    let in_transaction = |operation: &'static str, cut: usize| {
        let one = one.clone();
        async move {
            let open: i64 = sqlx::query_scalar("SELECT CAST(@@in_transaction AS SIGNED)")
                .fetch_one(&one)
                .await
                .unwrap_or_else(|e| {
                    panic!("{operation} cut at await {cut} kept the connection: {e}")
                });
            assert_eq!(
                open, 0,
                "{operation} cut at await {cut} left a transaction open"
            );
        }
    };
    cut_store_operations(&store, 10, in_transaction).await;
    let inbox = store.inbox();
    let mut inbox_cuts = 0;
    for _ in 0..10 {
        inbox_cuts +=
            cancel_at_every_await(|| inbox.begin(), |cut| in_transaction("inbox begin", cut)).await;
    }
    assert!(inbox_cuts > 0, "the inbox's begin was never cut");
}

/// migrate() on current tables (every deploy calls it at start-up), three
/// instances at once, takes no lock a producer can queue behind: while a
/// report holds the events table in an open transaction, every migrate()
/// returns and an enqueue beside them commits promptly.
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
