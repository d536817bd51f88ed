//! PostgreSQL where users break it (DESIGN.md §4, §5, §8): restored and
//! replicated databases, other applications' transactions on the same
//! server, relays waiting while producers hold transactions open, keys that
//! park, and producers that write SQL. Tests that restore or replicate start
//! private clusters of their own; the others use the shared server.
#![cfg(feature = "postgres")]

#[path = "../support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::store::{HeldBack, OutboxAdmin, OutboxStore, OutboxWriter};
use outbox_core::testing::store_suite::{drain_as, request};
use outbox_core::testing::{event, events_over_keys};
use outbox_core::{EventId, ManualClock, WakeUp};
use outbox_sql::testing::PrivatePg;
use outbox_sqlx::StoreConfig;
use outbox_sqlx::postgres::PgStore;
use sqlx::postgres::PgPoolOptions;
use support::pg::{connect, shared_store, shared_url};

mod sql_producers;

/// Claims and acks until nothing is left; the ids published, in order.
async fn drain(store: &PgStore) -> Vec<EventId> {
    drain_as(store, &request("drainer", 100)).await
}

async fn pending(store: &PgStore) -> u64 {
    store
        .stats()
        .await
        .unwrap()
        .iter()
        .map(|s| s.claimable + s.parked + s.in_flight)
        .sum()
}

fn ids(events: &[outbox_core::NewEvent]) -> HashSet<EventId> {
    events.iter().map(|e| e.event_id).collect()
}

/// A database dumped from one cluster and restored into another whose
/// transaction-id counter is behind (`burn_source`) or ahead
/// (`burn_target`): nothing published twice, every pending event published,
/// new events flow, and stats never show an empty backlog while rows wait.
async fn restore_case(burn_source: u32, burn_target: u32) {
    let source = PrivatePg::start(&[]);
    let target = PrivatePg::start(&[]);
    source.psql("postgres", "CREATE DATABASE app");
    if burn_source > 0 {
        source.burn_xids("app", burn_source);
    }
    if burn_target > 0 {
        target.burn_xids("postgres", burn_target);
    }
    let store = PgStore::new(connect(&source.url("app")).await, StoreConfig::default());
    store.migrate().await.unwrap();
    let published = events_over_keys(20, 5);
    OutboxWriter::enqueue(&store, &published).await.unwrap();
    assert_eq!(drain(&store).await.len(), 20);
    let waiting = events_over_keys(5, 5);
    OutboxWriter::enqueue(&store, &waiting).await.unwrap();
    store.pool().close().await;

    source.dump_into(&target, "app");
    let restored = PgStore::new(connect(&target.url("app")).await, StoreConfig::default());
    restored.migrate().await.unwrap();
    assert_eq!(
        pending(&restored).await,
        5,
        "stats must show what waits before any claim on the new cluster"
    );
    let fresh = events_over_keys(20, 5);
    OutboxWriter::enqueue(&restored, &fresh).await.unwrap();
    assert_eq!(pending(&restored).await, 25);
    let after: HashSet<EventId> = drain(&restored).await.into_iter().collect();
    let expected: HashSet<EventId> = ids(&waiting).union(&ids(&fresh)).copied().collect();
    assert_eq!(
        after, expected,
        "exactly the events pending at the dump and the new ones"
    );
    let later = events_over_keys(3, 3);
    OutboxWriter::enqueue(&restored, &later).await.unwrap();
    let last: HashSet<EventId> = drain(&restored).await.into_iter().collect();
    assert_eq!(last, ids(&later), "new events keep flowing");
    assert_eq!(pending(&restored).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_into_a_cluster_behind_publishes_every_pending_event() {
    restore_case(3000, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_into_a_cluster_ahead_publishes_every_pending_event() {
    restore_case(0, 6000).await;
}

/// A logical replica promoted after cutover, set up as the README says: its
/// tables made by migrate() (which writes no row a subscription's initial
/// copy would collide with), the data by subscription (sequences did not
/// come), its transaction ids its own. Its relay publishes every pending
/// event once, then, after migrate() on the new primary (sequences past the
/// rows, for producers), new events flow. Before, the initial copy of
/// outbox_control and outbox_cursor retried forever on duplicate keys and
/// the relay stopped on a duplicate lease token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logical_replica_after_cutover_publishes_every_pending_event() {
    let primary = PrivatePg::start(&["wal_level = logical"]);
    let replica = PrivatePg::start(&[]);
    primary.psql("postgres", "CREATE DATABASE app");
    primary.burn_xids("app", 3000);
    let store = PgStore::new(connect(&primary.url("app")).await, StoreConfig::default());
    store.migrate().await.unwrap();
    OutboxWriter::enqueue(&store, &events_over_keys(20, 5))
        .await
        .unwrap();
    assert_eq!(drain(&store).await.len(), 20);
    let waiting = events_over_keys(5, 5);
    OutboxWriter::enqueue(&store, &waiting).await.unwrap();

    // The schema on the replica, then the data by subscription.
    replica.psql("postgres", "CREATE DATABASE app");
    let replica_schema = PgStore::new(connect(&replica.url("app")).await, StoreConfig::default());
    replica_schema.migrate().await.unwrap();
    primary.psql("app", "CREATE PUBLICATION outbox_all FOR ALL TABLES");
    replica.psql(
        "app",
        &format!(
            "CREATE SUBSCRIPTION outbox_all CONNECTION 'host=127.0.0.1 port={} dbname=app user=postgres' \
             PUBLICATION outbox_all",
            primary.port()
        ),
    );
    let caught_up = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            // Every table's initial copy finished (each table is copied by
            // its own worker: the events and the cursor can be there while
            // the claim order is still on its way), and the rows are in.
            let rows = replica.psql(
                "app",
                "SELECT (SELECT count(*) FROM outbox_events) || ',' || \
                 (SELECT count(*) FROM outbox_cursor_now WHERE position > 0) || ',' || \
                 (SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r')",
            );
            if rows == "25,1,0" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(caught_up.is_ok(), "the replica never caught up");
    // Cutover: writes stop on the old primary, the subscription goes.
    store.pool().close().await;
    replica.psql("app", "ALTER SUBSCRIPTION outbox_all DISABLE");
    replica.psql(
        "app",
        "ALTER SUBSCRIPTION outbox_all SET (slot_name = NONE)",
    );
    replica.psql("app", "DROP SUBSCRIPTION outbox_all");

    // A relay on the new primary works before anyone runs migrate() (its
    // first claim notices the other cluster and moves the lease sequence
    // past the copied leases), then migrate() readies it for producers.
    let promoted = PgStore::new(connect(&replica.url("app")).await, StoreConfig::default());
    assert_eq!(pending(&promoted).await, 5);
    let relayed: HashSet<EventId> = drain(&promoted).await.into_iter().collect();
    assert_eq!(relayed, ids(&waiting));
    promoted.migrate().await.unwrap();
    let fresh = events_over_keys(20, 5);
    OutboxWriter::enqueue(&promoted, &fresh).await.unwrap();
    let after: HashSet<EventId> = drain(&promoted).await.into_iter().collect();
    assert_eq!(after, ids(&fresh));
}

/// A write transaction left open in another database of the server (a
/// batch job, an idle-in-transaction session) delays nothing here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_transaction_open_in_another_database_delays_nothing() {
    let (store, _) = shared_store(ManualClock::at_epoch()).await;
    let other = connect(&shared_url().replace("/outbox_test", "/postgres")).await;
    let mut stranger = other.begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *stranger)
        .await
        .unwrap();
    let e = event("a", 1);
    OutboxWriter::enqueue(&store, std::slice::from_ref(&e))
        .await
        .unwrap();
    let claimed = store.claim_batch(&request("r1", 10)).await.unwrap();
    assert_eq!(
        claimed
            .events
            .iter()
            .map(|c| c.event.event_id)
            .collect::<Vec<_>>(),
        vec![e.event_id],
        "a stranger's transaction held publication back"
    );
    stranger.rollback().await.unwrap();
}

/// A producer holding one enqueue transaction open while it enqueues on a
/// second connection completes, with a relay waiting for NOTIFY meanwhile:
/// no lock a producer takes queues behind a relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_enqueues_complete_while_a_relay_waits() {
    let (store, schema) = shared_store(ManualClock::at_epoch()).await;
    // An idle relay: it has looked (a first claim ticks) and found nothing.
    assert!(
        store
            .claim_batch(&request("r1", 10))
            .await
            .unwrap()
            .events
            .is_empty()
    );
    let mut outer = store.pool().begin().await.unwrap();
    store.enqueue(&mut outer, &[event("a", 1)]).await.unwrap();
    let mut wake_up = store.wake_up().await.unwrap();
    let waiting = tokio::spawn(async move {
        wake_up.wait().await;
    });
    // The relay has registered (or queued for a lock, in a design that
    // takes one): only then does the second enqueue start.
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let registered: bool = sqlx::query_scalar(&format!(
                "SELECT pg_sequence_last_value('{schema}.outbox_relay_waiting') IS NOT DISTINCT FROM 1"
            ))
            .fetch_one(store.pool())
            .await
            .unwrap();
            let lock_waiters: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
            )
            .fetch_one(store.pool())
            .await
            .unwrap();
            if registered || lock_waiters > 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the relay registered");
    let inner = tokio::time::timeout(Duration::from_secs(10), async {
        let mut inner = store.pool().begin().await.unwrap();
        store.enqueue(&mut inner, &[event("b", 1)]).await.unwrap();
        inner.commit().await.unwrap();
    })
    .await;
    outer.commit().await.unwrap();
    assert!(inner.is_ok(), "the inner enqueue waited behind a relay");
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting relay was woken by the commits")
        .unwrap();
}

/// A producer whose insert read `relay_waiting` just before a relay set it
/// sends no NOTIFY; its commit, however late, still wakes the relay (it
/// watches the producers that were mid-transaction when it registered), not
/// the next poll. `WakeUp::wait` alone has no poll: without the watch it
/// would wait forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_mid_transaction_when_the_relay_registers_wakes_it_on_commit() {
    let (store, schema) = shared_store(ManualClock::at_epoch()).await;
    assert!(
        store
            .claim_batch(&request("r1", 10))
            .await
            .unwrap()
            .events
            .is_empty()
    );
    let mut producer = store.pool().begin().await.unwrap();
    store
        .enqueue(&mut producer, &[event("a", 1)])
        .await
        .unwrap();
    let (producer_pid, database): (i32, String) =
        sqlx::query_as("SELECT pg_backend_pid(), current_database()::text")
            .fetch_one(&mut *producer)
            .await
            .unwrap();
    // An operator sees who holds the event back (DESIGN.md §8).
    let open = store
        .held_back()
        .await
        .unwrap()
        .into_iter()
        .find_map(|held| match held {
            HeldBack::OpenTransactions { transactions } => Some(transactions),
            _ => None,
        })
        .expect("the open producer is reported");
    let seen = open
        .iter()
        .find(|t| t.pid == i64::from(producer_pid))
        .expect("with its pid");
    assert_eq!(seen.database, database);
    assert!(seen.started_at <= chrono::Utc::now());
    let mut wake_up = store.wake_up().await.unwrap();
    let waiting = tokio::spawn(async move { wake_up.wait().await });
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let registered: bool = sqlx::query_scalar(&format!(
                "SELECT pg_sequence_last_value('{schema}.outbox_relay_waiting') IS NOT DISTINCT FROM 1"
            ))
            .fetch_one(store.pool())
            .await
            .unwrap();
            if registered {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the relay registered");
    // The producer's business work goes on well past any short second look.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "nothing was committed yet");
    producer.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the commit woke the waiting relay")
        .unwrap();
    assert_eq!(
        store
            .claim_batch(&request("r1", 10))
            .await
            .unwrap()
            .events
            .len(),
        1
    );
}

/// Nothing one key does holds the cursor: a key parked under Block, and a
/// key whose head a hung relay holds, while events of other keys pass
/// them. The cursor reaches the end of claim order (a claim reads from
/// there, not from the parked rows) and the held keys' later events wait
/// outside it: parked behind the failed head, or in the hung key's lane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_keys_and_hung_leases_never_hold_the_cursor() {
    use outbox_core::PoisonPolicy;
    use outbox_core::store::{FailReason, Nack, NackAction};
    let clock = ManualClock::at_epoch();
    let (store, schema) = shared_store(clock.clone()).await;
    let (blocked_head, hung_head) = (event("blocked", 0), event("hung", 0));
    OutboxWriter::enqueue(&store, &[blocked_head.clone(), hung_head.clone()])
        .await
        .unwrap();
    let heads = store.claim_batch(&request("r1", 10)).await.unwrap().events;
    assert_eq!(heads.len(), 2);
    let blocked_lease = heads
        .iter()
        .find(|c| c.event.event_id == blocked_head.event_id)
        .unwrap();
    store
        .nack(&[Nack {
            lease: blocked_lease.lease.clone(),
            action: NackAction::Fail {
                reason: FailReason::Permanent,
                block_key: true,
            },
            error_class: outbox_core::ErrorClass::Permanent,
            error: "poison".into(),
        }])
        .await
        .unwrap();
    // The hung relay's lease on "hung" is never settled; seconds later it
    // is older than any healthy batch (and shows as a long lease).
    clock.advance(Duration::from_secs(6));
    let mut others = events_over_keys(300, 30);
    others.push(event("blocked", 1));
    others.push(event("hung", 1));
    others.push(event("blocked", 2));
    OutboxWriter::enqueue(&store, &others).await.unwrap();
    let mut req = request("r2", 50);
    req.poison = PoisonPolicy::Block;
    let mut published = HashSet::new();
    loop {
        let claimed = store.claim_batch(&req).await.unwrap().events;
        if claimed.is_empty() {
            break;
        }
        published.extend(claimed.iter().map(|c| c.event.event_id));
        let leases: Vec<_> = claimed.iter().map(|c| c.lease.clone()).collect();
        store.ack(&leases).await.unwrap();
    }
    assert_eq!(published.len(), 300, "every other key drained");
    let (position, end): (i64, i64) = sqlx::query_as(&format!(
        "SELECT position, end_position FROM {schema}.outbox_cursor_now"
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(position, end, "the cursor is at the end of claim order");
    let parked: Vec<(String, i16)> = sqlx::query_as(&format!(
        "SELECT partition_key, status FROM {schema}.outbox_events
         WHERE partition_key IN ('blocked', 'hung') AND status IN (4, 5) ORDER BY sequence"
    ))
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        parked,
        vec![("blocked".to_owned(), 5), ("blocked".to_owned(), 5)],
        "the blocked key's later events are parked behind its failed head"
    );
    let laned: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT partition_key, cardinality(sequences)::int8 FROM {schema}.outbox_lanes"
    ))
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        laned,
        vec![("hung".to_owned(), 1)],
        "the hung key's later event waits in its lane, unwritten"
    );
    let held = store.held_back().await.unwrap();
    assert!(
        held.iter().any(|h| matches!(
            h,
            HeldBack::BlockedKeys {
                keys: 1,
                waiting: 2
            }
        )),
        "{held:?}"
    );
    assert!(
        held.iter().any(|h| matches!(h, HeldBack::LongLeases { .. })
            || matches!(h, HeldBack::ExpiredLeases { .. })),
        "{held:?}"
    );
}

/// Per key, publication follows commit order under concurrent producers,
/// some of which do business work (and so take their transaction id)
/// before they enqueue: an event written after another's commit returned
/// is published after it; one transaction's events keep their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_order_holds_under_concurrent_producers() {
    use outbox_core::memory::RecordingPublisher;
    use outbox_core::{CancellationToken, Relay};
    use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
    let (store, _) = shared_store(ManualClock::at_epoch()).await;
    let store = Arc::new(store);
    let publisher = Arc::new(RecordingPublisher::new());
    let mut config = outbox_core::testing::relay_suite::config("relay-causal");
    config.batch_size = 32;
    let shutdown = CancellationToken::new();
    let relay = Relay::new(store.clone(), publisher.clone(), config)
        .unwrap()
        .with_wake_up(store.wake_up().await.unwrap())
        .spawn(shutdown.clone());
    let clock = Arc::new(AtomicU64::new(0));
    // (event, key, tick before its insert, tick after its commit returned, tx, index in tx)
    type Written = (EventId, String, u64, u64, usize, usize);
    let mut producers = Vec::new();
    for p in 0..6u64 {
        let store = store.clone();
        let clock = clock.clone();
        producers.push(tokio::spawn(async move {
            let mut seed = p * 7919 + 13;
            let mut next = move || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                seed >> 33
            };
            let mut written: Vec<Written> = Vec::new();
            for t in 0..50usize {
                let key = format!("k{}", next() % 4);
                let mut tx = store.pool().begin().await.unwrap();
                if next() % 4 == 0 {
                    // Business work first: the transaction gets its id now.
                    sqlx::query("SELECT pg_current_xact_id()")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(5 + next() % 30)).await;
                }
                let n = 1 + (next() % 2) as usize;
                let events: Vec<_> = (0..n).map(|i| event(&key, t * 10 + i)).collect();
                let inserted = clock.fetch_add(1, AtomicOrdering::SeqCst);
                store.enqueue(&mut tx, &events).await.unwrap();
                tx.commit().await.unwrap();
                let committed = clock.fetch_add(1, AtomicOrdering::SeqCst);
                let tx_id = (p as usize) * 1000 + t;
                for (i, e) in events.iter().enumerate() {
                    written.push((e.event_id, key.clone(), inserted, committed, tx_id, i));
                }
            }
            written
        }));
    }
    let mut written: Vec<Written> = Vec::new();
    for producer in producers {
        written.extend(producer.await.unwrap());
    }
    tokio::time::timeout(
        Duration::from_secs(60),
        publisher.wait_for_deliveries(written.len()),
    )
    .await
    .expect("every event published");
    shutdown.cancel();
    relay.await.unwrap().unwrap();
    let order: std::collections::HashMap<EventId, usize> = publisher
        .delivered_ids()
        .into_iter()
        .enumerate()
        .map(|(i, id)| (id, i))
        .collect();
    let mut violations = Vec::new();
    for a in &written {
        for b in &written {
            let same_key = a.1 == b.1;
            let causal = a.3 < b.2;
            let same_tx_in_order = a.4 == b.4 && a.5 < b.5;
            if same_key && (causal || same_tx_in_order) && order[&a.0] > order[&b.0] {
                violations.push((a.0, b.0));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "{} per-key commit-order violations, e.g. {:?}",
        violations.len(),
        &violations[..violations.len().min(3)]
    );
}
