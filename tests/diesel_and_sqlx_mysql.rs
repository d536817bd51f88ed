//! A Diesel application's enqueue (sync and async) on live MariaDB,
//! published by the sqlx store's relay, and the other way round; inbox
//! claims shared by both: the two ORMs run one protocol
//! (`outbox_sql::mysql::Protocol`) over one set of tables.

use std::sync::Arc;
use std::time::Duration;

use diesel::Connection;
use diesel::connection::LoadConnection;
use diesel::mysql::Mysql;
use diesel::sql_types::Text;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use outbox_core::memory::RecordingPublisher;
use outbox_core::store::{EnqueueOutcome, OutboxAdmin};
use outbox_core::testing::{RelayFleet, event};
use outbox_core::{EventId, InboxStore, InvalidEvent, NewEvent, OutboxWriter, StoreError};
use outbox_diesel::mysql::{MysqlOutbox, MysqlStore};
use outbox_diesel::{StoreConfig, TableNames};
use outbox_sqlx::mysql::MySqlStore;

const DEADLINE: Duration = Duration::from_secs(30);

fn url() -> String {
    std::env::var("OUTBOX_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

/// A fresh database (dropped by `scripts/services.sh` on the next run)
/// with the sqlx store migrated in it, and the Diesel store beside it.
struct Db {
    name: String,
    sqlx: Arc<MySqlStore>,
    diesel: Arc<MysqlStore>,
}

fn config(database: &str) -> StoreConfig {
    StoreConfig::with_tables(TableNames::default().in_schema(database).unwrap())
}

impl Db {
    async fn create() -> Self {
        let name = format!(
            "outbox_t_x_{}",
            &EventId::random().as_uuid().simple().to_string()[..12]
        );
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(4)
            .connect(&url())
            .await
            .unwrap_or_else(|e| panic!("MariaDB unreachable at {}: {e}", url()));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&pool)
            .await
            .unwrap();
        let sqlx = MySqlStore::new(pool, config(&name));
        sqlx.migrate().await.unwrap();
        let diesel_pool = Pool::builder(AsyncDieselConnectionManager::<AsyncMysqlConnection>::new(
            url(),
        ))
        .max_size(4)
        .build()
        .unwrap();
        let diesel = MysqlStore::new(diesel_pool, config(&name));
        Self {
            name,
            sqlx: Arc::new(sqlx),
            diesel: Arc::new(diesel),
        }
    }

    fn outbox(&self) -> MysqlOutbox {
        self.diesel.outbox()
    }
}

async fn connect() -> AsyncMysqlConnection {
    AsyncMysqlConnection::establish(&url())
        .await
        .unwrap_or_else(|e| panic!("MariaDB unreachable at {}: {e}", url()))
}

/// Every field as written (the payload as JSON: a JSON column keeps its
/// value, not its spelling).
fn assert_same_event(delivered: &NewEvent, sent: &NewEvent) {
    let json = |p: &outbox_core::Payload| -> serde_json::Value {
        serde_json::from_str(p.as_str()).unwrap()
    };
    assert_eq!(json(&delivered.payload), json(&sent.payload));
    let mut delivered = delivered.clone();
    delivered.payload = sent.payload.clone();
    assert_eq!(&delivered, sent);
}

/// The event commits with the business row in one Diesel transaction, a
/// rolled-back transaction leaves neither, and the sqlx store's relay
/// publishes exactly the committed event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_commits_with_the_diesel_transaction_and_the_sqlx_relay_publishes_it() {
    let db = Db::create().await;
    let outbox = db.outbox();
    let mut conn = connect().await;
    let invoices = format!("{}.invoices", db.name);
    conn.batch_execute(&format!(
        "CREATE TABLE {invoices} (id VARCHAR(32) PRIMARY KEY, status TEXT NOT NULL) ENGINE = InnoDB;
         INSERT INTO {invoices} VALUES ('inv-1', 'open'), ('inv-2', 'open')"
    ))
    .await
    .unwrap();

    let paid = event("inv-1", 1);
    let pay = format!("UPDATE {invoices} SET status = 'paid' WHERE id = ?");
    let outcomes = conn
        .transaction::<_, outbox_diesel::Error, _>(async |conn| {
            diesel::sql_query(&pay)
                .bind::<Text, _>("inv-1")
                .execute(&mut *conn)
                .await?;
            Ok(outbox.enqueue(conn, std::slice::from_ref(&paid)).await?)
        })
        .await
        .unwrap();
    assert!(matches!(outcomes[..], [EnqueueOutcome::Inserted { .. }]));

    let rolled_back = event("inv-2", 1);
    let result = conn
        .transaction::<(), outbox_diesel::Error, _>(async |conn| {
            diesel::sql_query(&pay)
                .bind::<Text, _>("inv-2")
                .execute(&mut *conn)
                .await?;
            outbox
                .enqueue(conn, std::slice::from_ref(&rolled_back))
                .await?;
            Err(StoreError::Config("the payment was declined".into()).into())
        })
        .await;
    assert!(result.is_err());
    assert!(
        db.sqlx
            .event_state(rolled_back.event_id)
            .await
            .unwrap()
            .is_none()
    );

    let publisher = Arc::new(RecordingPublisher::new());
    let relays = RelayFleet::spawn(db.sqlx.clone(), publisher.clone(), "sqlx-relay", 1);
    tokio::time::timeout(DEADLINE, publisher.wait_for_deliveries(1))
        .await
        .expect("the sqlx relay publishes the event Diesel enqueued");
    relays.stop(DEADLINE).await;
    assert_eq!(publisher.delivered_ids(), vec![paid.event_id]);
    assert_same_event(&publisher.delivered()[0].event, &paid);
}

/// The other way round: events the sqlx store enqueued, published in key
/// order by relays over the Diesel store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_the_sqlx_store_enqueued_are_published_in_order_by_the_diesel_relay() {
    let db = Db::create().await;
    let events: Vec<NewEvent> = (1..=20)
        .map(|n| event(if n % 2 == 0 { "even" } else { "odd" }, n))
        .collect();
    OutboxWriter::enqueue(&*db.sqlx, &events).await.unwrap();
    let publisher = Arc::new(RecordingPublisher::new());
    let relays = RelayFleet::spawn(db.diesel.clone(), publisher.clone(), "diesel-relay", 2);
    tokio::time::timeout(DEADLINE, publisher.wait_for_deliveries(events.len()))
        .await
        .expect("the Diesel relays publish what sqlx enqueued");
    relays.stop(DEADLINE).await;
    let delivered = publisher.delivered();
    assert_eq!(delivered.len(), events.len(), "each event once");
    for key in ["even", "odd"] {
        let sent: Vec<EventId> = events
            .iter()
            .filter(|e| e.partition_key == key)
            .map(|e| e.event_id)
            .collect();
        let got: Vec<EventId> = delivered
            .iter()
            .filter(|d| d.event.partition_key == key)
            .map(|d| d.event.event_id)
            .collect();
        assert_eq!(got, sent, "key {key} in enqueue order");
    }
    for sent in &events {
        let got = delivered
            .iter()
            .find(|d| d.event.event_id == sent.event_id)
            .unwrap();
        assert_same_event(&got.event, sent);
    }
}

/// Bad input is refused with a typed error before anything is sent, so the
/// caller's Diesel transaction stays usable; a duplicate id is a reported
/// no-op, inside one bulk insert and across calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_the_insert_and_duplicates_are_reported() {
    let db = Db::create().await;
    let outbox = db.outbox();
    let mut conn = connect().await;
    let good = event("k", 1);
    let mut bad = event("k", 2);
    bad.partition_key = String::new();
    let outcomes = conn
        .transaction::<_, outbox_diesel::Error, _>(async |conn| {
            let refused = outbox.enqueue(conn, &[good.clone(), bad.clone()]).await;
            assert!(
                matches!(
                    refused,
                    Err(StoreError::InvalidEvent(InvalidEvent::EmptyField(
                        "partition_key"
                    )))
                ),
                "{refused:?}"
            );
            Ok(outbox.enqueue(conn, &[good.clone(), good.clone()]).await?)
        })
        .await
        .unwrap();
    assert!(matches!(
        outcomes[..],
        [
            EnqueueOutcome::Inserted { .. },
            EnqueueOutcome::AlreadyExists
        ]
    ));
    let again = conn
        .transaction::<_, outbox_diesel::Error, _>(async |conn| {
            Ok(outbox.enqueue(conn, std::slice::from_ref(&good)).await?)
        })
        .await
        .unwrap();
    assert_eq!(again, [EnqueueOutcome::AlreadyExists]);
    let stats = db.sqlx.stats().await.unwrap();
    assert_eq!(
        stats[0].claimable, 1,
        "one row for the good event: {stats:?}"
    );
}

/// Diesel's own `MysqlConnection` (links libmariadb): feature `diesel-sync`.
#[cfg(feature = "diesel-sync")]
fn libmariadb() -> diesel::MysqlConnection {
    diesel::MysqlConnection::establish(&url())
        .unwrap_or_else(|e| panic!("MariaDB unreachable at {}: {e}", url()))
}

/// diesel-async's connection behind Diesel's synchronous `Connection`
/// (pure Rust), on a blocking thread of the test's runtime.
fn wrapped() -> AsyncConnectionWrapper<AsyncMysqlConnection> {
    <AsyncConnectionWrapper<AsyncMysqlConnection> as Connection>::establish(&url())
        .unwrap_or_else(|e| panic!("MariaDB unreachable at {}: {e}", url()))
}

/// The synchronous API on a connection from `connect`: `migrate_sync`
/// on a fresh database, then a bulk `enqueue_sync` inside
/// `conn.transaction(|conn| …)`, which the sqlx store finds.
async fn the_sync_api_migrates_and_enqueues<C>(connect: fn() -> C)
where
    C: LoadConnection<Backend = Mysql> + Send + 'static,
{
    let database = format!(
        "outbox_t_sync_{}",
        &EventId::random().as_uuid().simple().to_string()[..12]
    );
    let outbox = MysqlOutbox::new(config(&database));
    let events: Vec<NewEvent> = (1..=3).map(|n| event("sync", n)).collect();
    let (migrated, again, outcomes, dup) = tokio::task::spawn_blocking({
        let (outbox, database, events) = (outbox.clone(), database.clone(), events.clone());
        move || {
            let mut conn = connect();
            conn.batch_execute(&format!("CREATE DATABASE {database}"))
                .unwrap();
            let migrated = outbox.migrate_sync(&mut conn).unwrap();
            let again = outbox.migrate_sync(&mut conn).unwrap();
            let outcomes = conn
                .transaction::<_, outbox_diesel::Error, _>(|conn| {
                    Ok(outbox.enqueue_sync(conn, &events)?)
                })
                .unwrap();
            let dup = conn
                .transaction::<_, outbox_diesel::Error, _>(|conn| {
                    Ok(outbox.enqueue_sync(conn, &events[..1])?)
                })
                .unwrap();
            (migrated, again, outcomes, dup)
        }
    })
    .await
    .unwrap();
    assert!(migrated.created(), "{migrated:?}");
    assert_eq!(again.found, Some(2));
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, EnqueueOutcome::Inserted { .. })),
        "{outcomes:?}"
    );
    assert_eq!(dup, [EnqueueOutcome::AlreadyExists]);

    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .connect(&url())
        .await
        .unwrap();
    let sqlx_store = MySqlStore::new(pool, config(&database));
    let found = sqlx_store.migrate().await.unwrap();
    assert_eq!(
        found.found,
        Some(2),
        "the sqlx store finds Diesel's tables current"
    );
    assert_eq!(sqlx_store.stats().await.unwrap()[0].claimable, 3);
}

#[cfg(feature = "diesel-sync")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sync_api_migrates_and_enqueues_in_a_mysql_connection_transaction() {
    the_sync_api_migrates_and_enqueues(libmariadb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sync_api_migrates_and_enqueues_on_the_async_connection_wrapper() {
    the_sync_api_migrates_and_enqueues(wrapped).await;
}

/// `apply_once_sync` on a connection from `connect`: the effect runs once
/// per consumer and event, a redelivery runs nothing, a failing effect
/// leaves no claim (the next delivery applies it), and another consumer
/// applies the same event on its own.
async fn apply_once_sync_applies_each_event_once<C>(connect: fn() -> C)
where
    C: LoadConnection<Backend = Mysql> + Send + 'static,
{
    let db = Db::create().await;
    let outbox = db.outbox();
    let effects = format!("{}.effects", db.name);
    let (first, second) = (EventId::random(), EventId::random());
    let outcomes = tokio::task::spawn_blocking({
        let effects = effects.clone();
        move || {
            let mut conn = connect();
            conn.batch_execute(&format!(
                "CREATE TABLE {effects} (seq BIGINT AUTO_INCREMENT PRIMARY KEY,
                     consumer VARCHAR(64) NOT NULL, event_id CHAR(36) NOT NULL) ENGINE = InnoDB"
            ))
            .unwrap();
            let mut apply = |consumer: &str, event_id: EventId, fail: bool| {
                outbox.apply_once_sync(&mut conn, consumer, event_id, |conn| {
                    // Fully qualified: diesel-async's `RunQueryDsl` is in
                    // scope in this file for the async tests.
                    diesel::RunQueryDsl::execute(
                        diesel::sql_query(format!(
                            "INSERT INTO {effects} (consumer, event_id) VALUES (?, ?)"
                        ))
                        .bind::<Text, _>(consumer)
                        .bind::<Text, _>(event_id.to_string()),
                        conn,
                    )?;
                    if fail {
                        return Err(outbox_diesel::Error::Outbox(StoreError::Config(
                            "the handler gave up".into(),
                        )));
                    }
                    Ok(())
                })
            };
            [
                apply("billing", first, false).ok(),
                apply("billing", first, false).ok(),
                apply("billing", second, true).ok(),
                apply("billing", second, false).ok(),
                apply("revenue", first, false).ok(),
            ]
        }
    })
    .await
    .unwrap();
    assert_eq!(
        outcomes,
        [
            Some(Some(())),
            Some(None), // a redelivery runs nothing
            None,       // the effect failed: its claim rolled back with it
            Some(Some(())),
            Some(Some(())),
        ]
    );
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&url())
        .await
        .unwrap();
    let applied: Vec<(String, String)> = sqlx::query_as(&format!(
        "SELECT consumer, event_id FROM {effects} ORDER BY seq"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        applied,
        [
            ("billing".to_string(), first.to_string()),
            ("billing".to_string(), second.to_string()),
            ("revenue".to_string(), first.to_string())
        ],
        "each consumer applied each event once; the failed attempt left nothing"
    );
    // The claims are the inbox's: the sqlx inbox sees them as duplicates.
    let inbox = db.sqlx.inbox();
    let mut tx = inbox.begin().await.unwrap();
    assert!(!inbox.claim(&mut tx, "billing", second).await.unwrap());
    inbox.rollback(tx).await.unwrap();
}

#[cfg(feature = "diesel-sync")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_once_sync_on_a_mysql_connection_applies_each_event_once() {
    apply_once_sync_applies_each_event_once(libmariadb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_once_sync_on_the_async_connection_wrapper_applies_each_event_once() {
    apply_once_sync_applies_each_event_once(wrapped).await;
}

/// Inbox claims are one table: a claim committed through Diesel is a
/// duplicate to the sqlx inbox, and the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_claims_written_by_one_orm_are_seen_by_the_other() {
    let db = Db::create().await;
    let (diesel_inbox, sqlx_inbox) = (db.diesel.inbox(), db.sqlx.inbox());
    outbox_tests::assert_inbox_claims_are_shared(&diesel_inbox, &sqlx_inbox).await;
}
