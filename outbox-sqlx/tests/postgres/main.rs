//! The core's conformance suites and PostgreSQL-specific checks, against a
//! live server (`OUTBOX_PG_URL`, default the loopback `outbox_test` database).
#![cfg(feature = "postgres")]

#[path = "../support/mod.rs"]
mod support;

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use outbox_core::store::{EnqueueOutcome, EventState, OutboxAdmin};
use outbox_core::testing::{InboxHarness, event, event_with_payload};
use outbox_core::{EventId, InvalidEvent, ManualClock, StoreError};
use outbox_sqlx::postgres::{PgInbox, PgStore};
use outbox_sqlx::{StoreConfig, TableNames};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Postgres, Row, Transaction};
// A migrated store in a schema of its own, and that schema's name (for
// tests that look at the tables).
use support::pg::{connect, shared_store as store_in_schema, shared_url as url};

mod migrate;

async fn pool() -> PgPool {
    connect(&url()).await
}

/// A store on fresh tables in a schema of its own.
async fn store_on(clock: ManualClock) -> PgStore {
    store_in_schema(clock).await.0
}

/// Boxed as `dyn Future + Send`: works around rustc's "not general enough"
/// limitation on unboxed async fns that borrow sqlx connections.
fn pg_store(clock: ManualClock) -> BoxFuture<'static, Arc<PgStore>> {
    Box::pin(async move { Arc::new(store_on(clock).await) })
}

mod store {
    outbox_core::store_conformance_tests!(super::pg_store);

    outbox_core::commit_order_conformance_tests!(super::pg_store);
}

mod relay {
    outbox_core::relay_conformance_tests!(super::pg_store);
}

mod failure {
    outbox_core::failure_conformance_tests!(super::pg_store);
}

/// The inbox plus an effects table written in the same transaction.
struct PgInboxHarness {
    inbox: PgInbox,
    pool: PgPool,
    effects: String,
    clock: ManualClock,
}

#[async_trait]
impl InboxHarness for PgInboxHarness {
    type Inbox = PgInbox;
    fn inbox(&self) -> &PgInbox {
        &self.inbox
    }
    async fn apply_effect(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        consumer: &str,
        event_id: EventId,
    ) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "INSERT INTO {} (consumer, event_id) VALUES ($1, $2)",
            self.effects
        ))
        .bind(consumer)
        .bind(event_id.as_uuid())
        .execute(&mut **tx)
        .await
        .map_err(StoreError::fatal)?;
        Ok(())
    }
    async fn effects(&self, consumer: &str) -> Result<Vec<EventId>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT event_id FROM {} WHERE consumer = $1 ORDER BY seq",
            self.effects
        ))
        .bind(consumer)
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::fatal)?;
        Ok(rows
            .iter()
            .map(|r| EventId::from_uuid(r.get("event_id")))
            .collect())
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

fn pg_inbox(clock: ManualClock) -> BoxFuture<'static, Arc<PgInboxHarness>> {
    Box::pin(pg_inbox_inner(clock))
}

async fn pg_inbox_inner(clock: ManualClock) -> Arc<PgInboxHarness> {
    let store = store_on(clock.clone()).await;
    let schema = store_schema(&store);
    let effects = format!("{schema}.effects");
    sqlx::query(&format!(
        "CREATE TABLE {effects} (seq BIGSERIAL PRIMARY KEY, consumer TEXT NOT NULL, event_id UUID NOT NULL)"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    Arc::new(PgInboxHarness {
        inbox: store.inbox(),
        pool: store.pool().clone(),
        effects,
        clock,
    })
}

fn store_schema(store: &PgStore) -> String {
    let sql = store.schema_sql();
    let start = sql.find("CREATE TABLE IF NOT EXISTS ").unwrap() + 27;
    sql[start..].split('.').next().unwrap().to_owned()
}

mod inbox {
    outbox_core::inbox_conformance_tests!(super::pg_inbox);
}

#[tokio::test]
async fn enqueue_joins_the_callers_transaction() {
    let store = store_on(ManualClock::at_epoch()).await;
    let (kept, dropped) = (event("a", 1), event("a", 2));
    let mut tx = store.pool().begin().await.unwrap();
    store
        .enqueue(&mut tx, std::slice::from_ref(&dropped))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    let outcome = store
        .enqueue(&mut tx, std::slice::from_ref(&kept))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(matches!(outcome[0], EnqueueOutcome::Inserted { .. }));
    assert_eq!(store.event_state(dropped.event_id).await.unwrap(), None);
    assert!(matches!(
        store.event_state(kept.event_id).await.unwrap(),
        Some(EventState::Pending { .. })
    ));
}

#[tokio::test]
async fn bad_input_gets_a_typed_error_before_the_insert() {
    let store = store_on(ManualClock::at_epoch()).await;
    let nul = event_with_payload("a", 1, serde_json::json!({ "memo": "x\u{0}y" }));
    let mut nul_key = event("a", 2);
    nul_key.aggregate_id = "inv\0".into();
    for (bad, what) in [(nul, "U+0000 in jsonb"), (nul_key, "NUL in text")] {
        let mut tx = store.pool().begin().await.unwrap();
        let err = store.enqueue(&mut tx, &[bad]).await.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::InvalidEvent(InvalidEvent::UnstorableCharacter(_))
            ),
            "{what}: {err:?}"
        );
        // The caller's transaction is still usable: nothing was sent.
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    }
}

#[tokio::test]
async fn duplicate_ids_inside_one_bulk_insert() {
    let store = store_on(ManualClock::at_epoch()).await;
    let e = event("a", 1);
    let mut twin = event("a", 2);
    twin.event_id = e.event_id;
    let outcomes = outbox_core::OutboxWriter::enqueue(&store, &[e, twin])
        .await
        .unwrap();
    assert!(matches!(outcomes[0], EnqueueOutcome::Inserted { .. }));
    assert_eq!(outcomes[1], EnqueueOutcome::AlreadyExists);
}

/// One transaction of 5,000 events, then one of 100: sequences in array
/// order, and per-key claims of 1,000 hand them out in that order, in full
/// (each transaction in a tick of its own).
#[tokio::test]
async fn bulk_enqueue_keeps_array_order_per_key() {
    let store = store_on(ManualClock::at_epoch()).await;
    let events: Vec<_> = (0..5100).map(|n| event("hot", n)).collect();
    let mut sequences = Vec::new();
    let mut claimed = Vec::new();
    for chunk in [&events[..5000], &events[5000..]] {
        let outcomes = outbox_core::OutboxWriter::enqueue(&store, chunk)
            .await
            .unwrap();
        sequences.extend(outcomes.iter().map(|o| match o {
            EnqueueOutcome::Inserted { sequence } => *sequence,
            EnqueueOutcome::AlreadyExists => panic!("all new"),
        }));
        let request = outbox_core::testing::store_suite::request("bulk", 1_000);
        claimed.extend(outbox_core::testing::store_suite::drain_as(&store, &request).await);
    }
    assert!(sequences.windows(2).all(|w| w[0] < w[1]));
    let enqueued: Vec<EventId> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(claimed, enqueued, "claimed in full, in commit order");
}

#[tokio::test]
async fn notify_wakes_an_idle_relay() {
    use outbox_core::memory::RecordingPublisher;
    use outbox_core::{CancellationToken, Relay};
    let store = Arc::new(store_on(ManualClock::at_epoch()).await);
    let publisher = Arc::new(RecordingPublisher::new());
    let mut config = outbox_core::testing::relay_suite::config("pg-listener");
    config.poll_interval = std::time::Duration::from_secs(3600);
    let wake_up = store.wake_up().await.unwrap();
    let shutdown = CancellationToken::new();
    let relay = Relay::new(store.clone(), publisher.clone(), config)
        .unwrap()
        .with_wake_up(wake_up)
        .spawn(shutdown.clone());
    // Wait until the relay is idle (its heartbeat precedes the first claim).
    loop {
        if !store.relays().await.unwrap().is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    outbox_core::OutboxWriter::enqueue(&*store, &[event("a", 1)])
        .await
        .unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        publisher.wait_for_deliveries(1),
    )
    .await
    .expect("NOTIFY woke the relay long before its hour-long poll");
    shutdown.cancel();
    relay.await.unwrap().unwrap();
}

/// A busy relay costs producers no NOTIFY: with no relay waiting an
/// enqueue sends none; once a relay waits (`PgWakeUp::wait` sets the flag)
/// the next enqueue does, and a claim clears the flag again. A sentinel
/// notification sent after each enqueue shows what came first (PostgreSQL
/// delivers notifications in commit order).
#[tokio::test]
async fn enqueue_notifies_only_while_a_relay_waits() {
    use outbox_core::WakeUp;
    use outbox_core::store::OutboxStore;
    use outbox_core::testing::store_suite::request;
    let store = store_on(ManualClock::at_epoch()).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .unwrap();
    listener.listen(store.channel()).await.unwrap();
    async fn first_after(
        store: &PgStore,
        listener: &mut sqlx::postgres::PgListener,
        n: usize,
    ) -> String {
        outbox_core::OutboxWriter::enqueue(store, &[event("a", n)])
            .await
            .unwrap();
        sqlx::query("SELECT pg_notify($1, 'sentinel')")
            .bind(store.channel())
            .execute(store.pool())
            .await
            .unwrap();
        listener.recv().await.unwrap().payload().to_string()
    }
    assert_eq!(
        first_after(&store, &mut listener, 1).await,
        "sentinel",
        "no relay waits"
    );

    let mut wake_up = store.wake_up().await.unwrap();
    // Registers, sees event 1 claimable and returns at once.
    tokio::time::timeout(std::time::Duration::from_secs(10), wake_up.wait())
        .await
        .expect("a claimable event ends the wait at once");
    assert_eq!(
        first_after(&store, &mut listener, 2).await,
        "",
        "a relay waits"
    );
    assert_eq!(listener.recv().await.unwrap().payload(), "sentinel");

    let request = request("r1", 10);
    assert_eq!(store.claim_batch(&request).await.unwrap().events.len(), 2);
    assert_eq!(
        first_after(&store, &mut listener, 3).await,
        "sentinel",
        "the claim cleared the flag"
    );
}

#[tokio::test]
async fn shipped_migration_is_the_default_rendering() {
    let store = PgStore::new(
        PgPoolOptions::new().connect_lazy(&url()).unwrap(),
        StoreConfig::default(),
    );
    let on_disk = include_str!("../../migrations/postgres/0001_outbox.sql");
    assert_eq!(
        on_disk,
        store.schema_sql(),
        "regenerate migrations/postgres/0001_outbox.sql from PgStore::schema_sql()"
    );
}

mod fails_fast;

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

/// A store operation cut off at any await point (an aborted task, a drain
/// timeout, a `select!`) leaves no pooled connection inside a transaction.
/// sqlx's own `BEGIN`, cut between the statement and its answer, did: the
/// next borrower (the application, on a shared pool) then ran inside a
/// transaction nothing would commit.
#[tokio::test]
async fn operations_cut_off_anywhere_leave_no_transaction_open() {
    use outbox_core::testing::cancel_at_every_await;
    use outbox_core::{InboxStore, OutboxStore, OutboxWriter};

    let migrated = store_on(ManualClock::at_epoch()).await;
    // One connection, named: the one a cut operation left behind is the
    // one the check finds.
    let name = support::unique_name("cut");
    let options: sqlx::postgres::PgConnectOptions = url().parse().unwrap();
    let one = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.application_name(&name))
        .await
        .unwrap();
    let observer = pool().await;
    let store = PgStore::new(one.clone(), migrated.config().clone());
    let in_transaction = |operation: &'static str| {
        let (one, observer, name) = (one.clone(), observer.clone(), name.clone());
        move |cut: usize| {
            let (one, observer, name) = (one.clone(), observer.clone(), name.clone());
            async move {
                // Once the pool hands the connection out again it is
                // settled: what the server says of it then is what the
                // next borrower would inherit.
                let held = one.acquire().await.unwrap();
                let state: String = sqlx::query_scalar(
                    "SELECT state FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(&name)
                .fetch_one(&observer)
                .await
                .unwrap();
                drop(held);
                assert_eq!(
                    state, "idle",
                    "{operation} cut at await {cut} left a transaction open"
                );
            }
        }
    };
    let mut n = 0;
    let enqueue_cuts = cancel_at_every_await(
        || {
            n += 1;
            let events = vec![event("cut", n)];
            let store = store.clone();
            async move { OutboxWriter::enqueue(&store, &events).await }
        },
        in_transaction("enqueue"),
    )
    .await;
    let inbox = store.inbox();
    let inbox_cuts = cancel_at_every_await(|| inbox.begin(), in_transaction("inbox begin")).await;
    // Claims and acks run on connections the store keeps apart from the
    // pool: after each cut, the next claim must still answer.
    let backlog: Vec<_> = (0..2_000).map(|n| event(&format!("k{n}"), n)).collect();
    OutboxWriter::enqueue(&store, &backlog).await.unwrap();
    let request = outbox_core::testing::store_suite::request("cut", 3);
    let still_claims = |operation: &'static str| {
        let (store, request) = (store.clone(), request.clone());
        move |cut: usize| {
            let (store, request) = (store.clone(), request.clone());
            async move {
                let next = tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    store.claim_batch(&request),
                )
                .await;
                assert!(
                    matches!(next, Ok(Ok(_))),
                    "{operation} cut at await {cut}: the next claim got {next:?}"
                );
            }
        }
    };
    let claim_cuts =
        cancel_at_every_await(|| store.claim_batch(&request), still_claims("claim_batch")).await;
    let leases: Vec<_> = store
        .claim_batch(&request)
        .await
        .unwrap()
        .events
        .into_iter()
        .map(|c| c.lease)
        .collect();
    assert!(!leases.is_empty(), "a backlog left to ack");
    let ack_cuts = cancel_at_every_await(|| store.ack(&leases), still_claims("ack")).await;
    assert!(
        enqueue_cuts > 0 && inbox_cuts > 0 && claim_cuts > 0 && ack_cuts > 0,
        "each was cut before a run completed: {enqueue_cuts}, {inbox_cuts}, {claim_cuts}, {ack_cuts}"
    );
}

/// `held_back` lists the transactions of producers (they hold their events
/// back), never the store's own: a transaction that writes the events and
/// leases tables without inserting an event (what a settlement or a purge
/// does) is no stranger, however long it stays open.
#[tokio::test]
async fn open_transactions_are_the_producers_only() {
    let (store, schema) = store_in_schema(ManualClock::at_epoch()).await;
    use outbox_core::store::{HeldBack, OutboxStore};
    // The first claim writes the control row.
    store
        .claim_batch(&outbox_core::testing::store_suite::request("relay", 1))
        .await
        .unwrap();
    let mut own = store.pool().begin().await.unwrap();
    sqlx::raw_sql(&format!(
        "UPDATE {schema}.outbox_events SET status = status WHERE FALSE;
         DELETE FROM {schema}.outbox_leases WHERE FALSE"
    ))
    .execute(&mut *own)
    .await
    .unwrap();
    let own_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *own)
        .await
        .unwrap();
    let open = |store: PgStore| async move {
        store
            .held_back()
            .await
            .unwrap()
            .into_iter()
            .find_map(|held| match held {
                HeldBack::OpenTransactions { transactions } => Some(transactions),
                _ => None,
            })
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.pid)
            .collect::<Vec<_>>()
    };
    assert!(
        !open(store.clone()).await.contains(&i64::from(own_pid)),
        "the store's own kind of transaction listed as a producer"
    );
    let mut producer = store.pool().begin().await.unwrap();
    store
        .enqueue(&mut producer, &[event("a", 1)])
        .await
        .unwrap();
    let producer_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *producer)
        .await
        .unwrap();
    let listed = open(store.clone()).await;
    assert!(listed.contains(&i64::from(producer_pid)), "{listed:?}");
    assert!(!listed.contains(&i64::from(own_pid)), "{listed:?}");
    producer.commit().await.unwrap();
    own.rollback().await.unwrap();
    assert!(open(store.clone()).await.is_empty());
}
