//! A Diesel application's enqueue (sync and async) on live PostgreSQL,
//! published by the sqlx store's relay over the same tables: the two ORMs
//! run one protocol. The synchronous API runs on diesel-async's
//! `AsyncConnectionWrapper` (pure Rust) and, with feature `diesel-sync`,
//! on Diesel's own `PgConnection` (libpq).

use std::sync::Arc;
use std::time::Duration;

use diesel::connection::LoadConnection;
use diesel::pg::Pg;
use diesel::sql_types::{Text, Uuid as SqlUuid};
use diesel::{Connection, RunQueryDsl};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use outbox_core::memory::RecordingPublisher;
use outbox_core::store::{EnqueueOutcome, OutboxAdmin};
use outbox_core::testing::{RelayFleet, event};
use outbox_core::{EventId, InboxStore, InvalidEvent, NewEvent, StoreError};
use outbox_diesel::postgres::PgOutbox;
use outbox_diesel::{StoreConfig, TableNames};
use outbox_sqlx::postgres::{EndToEndDb, PgStore};

const DEADLINE: Duration = Duration::from_secs(30);

fn url() -> String {
    std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".into())
}

async fn connect() -> AsyncPgConnection {
    AsyncPgConnection::establish(&url())
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL unreachable at {}: {e}", url()))
}

fn outbox_in(schema: &str) -> PgOutbox {
    PgOutbox::new(StoreConfig::with_tables(
        TableNames::default().in_schema(schema).unwrap(),
    ))
}

/// The event commits with the business row in one Diesel transaction, a
/// rolled-back transaction leaves neither, and the sqlx store's relay
/// publishes exactly the committed event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_commits_with_the_diesel_transaction_and_the_sqlx_relay_publishes_it() {
    let db = EndToEndDb::create("diesel").await;
    let outbox = outbox_in(&db.schema);
    let mut conn = connect().await;
    let invoices = format!("{}.invoices", db.schema);
    conn.batch_execute(&format!(
        "CREATE TABLE {invoices} (id TEXT PRIMARY KEY, status TEXT NOT NULL);
         INSERT INTO {invoices} VALUES ('inv-1', 'open'), ('inv-2', 'open')"
    ))
    .await
    .unwrap();

    let paid = event("inv-1", 1);
    let pay = format!("UPDATE {invoices} SET status = 'paid' WHERE id = $1");
    let outcomes = conn
        .transaction::<_, outbox_diesel::Error, _>(async |conn| {
            diesel_async::RunQueryDsl::execute(
                diesel::sql_query(&pay).bind::<diesel::sql_types::Text, _>("inv-1"),
                &mut *conn,
            )
            .await?;
            Ok(outbox.enqueue(conn, std::slice::from_ref(&paid)).await?)
        })
        .await
        .unwrap();
    assert!(matches!(outcomes[..], [EnqueueOutcome::Inserted { .. }]));

    let rolled_back = event("inv-2", 1);
    let result = conn
        .transaction::<(), outbox_diesel::Error, _>(async |conn| {
            diesel_async::RunQueryDsl::execute(
                diesel::sql_query(&pay).bind::<diesel::sql_types::Text, _>("inv-2"),
                &mut *conn,
            )
            .await?;
            outbox
                .enqueue(conn, std::slice::from_ref(&rolled_back))
                .await?;
            Err(StoreError::Config("the payment was declined".into()).into())
        })
        .await;
    assert!(result.is_err());
    assert!(
        db.store
            .event_state(rolled_back.event_id)
            .await
            .unwrap()
            .is_none()
    );

    let publisher = Arc::new(RecordingPublisher::new());
    let relays = RelayFleet::spawn(db.store.clone(), publisher.clone(), "sqlx-relay", 1);
    tokio::time::timeout(DEADLINE, publisher.wait_for_deliveries(1))
        .await
        .expect("the sqlx relay publishes the event Diesel enqueued");
    relays.stop(DEADLINE).await;
    assert_eq!(publisher.delivered_ids(), vec![paid.event_id]);
    // Every field as written (the payload as JSON: jsonb keeps its value,
    // not its spelling).
    let mut delivered = publisher.delivered()[0].event.clone();
    let json = |p: &outbox_core::Payload| -> serde_json::Value {
        serde_json::from_str(p.as_str()).unwrap()
    };
    assert_eq!(json(&delivered.payload), json(&paid.payload));
    delivered.payload = paid.payload.clone();
    assert_eq!(delivered, paid);
}

/// Bad input is refused with a typed error before anything is sent, so the
/// caller's Diesel transaction stays usable; a duplicate id is a reported
/// no-op, inside one bulk insert and across calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_the_insert_and_duplicates_are_reported() {
    let db = EndToEndDb::create("diesel").await;
    let outbox = outbox_in(&db.schema);
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
            // The transaction is still usable: the good event goes in, and
            // a repeat of it in the same batch is reported, not written.
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
    let stats = db.store.stats().await.unwrap();
    assert_eq!(
        stats[0].claimable, 1,
        "one row for the good event: {stats:?}"
    );
}

/// Diesel's own `PgConnection` (links libpq): feature `diesel-sync`.
#[cfg(feature = "diesel-sync")]
fn libpq() -> diesel::PgConnection {
    diesel::PgConnection::establish(&url())
        .unwrap_or_else(|e| panic!("PostgreSQL unreachable at {}: {e}", url()))
}

/// diesel-async's connection behind Diesel's synchronous `Connection`
/// (pure Rust), on a blocking thread of the test's runtime.
fn wrapped() -> AsyncConnectionWrapper<AsyncPgConnection> {
    <AsyncConnectionWrapper<AsyncPgConnection> as Connection>::establish(&url())
        .unwrap_or_else(|e| panic!("PostgreSQL unreachable at {}: {e}", url()))
}

/// The synchronous API on a connection from `connect`: `migrate_sync` on a
/// fresh schema, a bulk `enqueue_sync` inside `conn.transaction(|conn| …)`,
/// and the sqlx store finds the tables current and the events claimable.
async fn the_sync_api_migrates_and_enqueues<C>(connect: fn() -> C)
where
    C: LoadConnection<Backend = Pg> + 'static,
{
    let schema = format!(
        "diesel_{}",
        &EventId::random().as_uuid().simple().to_string()[..12]
    );
    let outbox = outbox_in(&schema);
    let events: Vec<NewEvent> = (1..=3).map(|n| event("sync", n)).collect();
    let (migrated, again, outcomes) = tokio::task::spawn_blocking({
        let (outbox, schema, events) = (outbox.clone(), schema.clone(), events.clone());
        move || {
            let mut conn = connect();
            conn.batch_execute(&format!("CREATE SCHEMA {schema}"))
                .unwrap();
            let migrated = outbox.migrate_sync(&mut conn).unwrap();
            let again = outbox.migrate_sync(&mut conn).unwrap();
            let outcomes = conn
                .transaction::<_, outbox_diesel::Error, _>(|conn| {
                    Ok(outbox.enqueue_sync(conn, &events)?)
                })
                .unwrap();
            (migrated, again, outcomes)
        }
    })
    .await
    .unwrap();
    assert!(migrated.created(), "{migrated:?}");
    assert_eq!(again.found, Some(2));
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, EnqueueOutcome::Inserted { .. }))
    );

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url())
        .await
        .unwrap();
    let sqlx_store = PgStore::new(
        pool.clone(),
        outbox_sqlx::StoreConfig::with_tables(
            outbox_sqlx::TableNames::default()
                .in_schema(&schema)
                .unwrap(),
        ),
    );
    let found = sqlx_store.migrate().await.unwrap();
    assert_eq!(
        found.found,
        Some(2),
        "the sqlx store finds Diesel's tables current"
    );
    assert_eq!(sqlx_store.stats().await.unwrap()[0].claimable, 3);
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}

#[cfg(feature = "diesel-sync")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sync_api_migrates_and_enqueues_in_a_pg_connection_transaction() {
    the_sync_api_migrates_and_enqueues(libpq).await;
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
    C: LoadConnection<Backend = Pg> + 'static,
{
    let db = EndToEndDb::create("dsync").await;
    let outbox = outbox_in(&db.schema);
    let effects = format!("{}.effects", db.schema);
    let (first, second) = (EventId::random(), EventId::random());
    let outcomes = tokio::task::spawn_blocking(move || {
        let mut conn = connect();
        let mut apply = |consumer: &str, event_id: EventId, fail: bool| {
            outbox.apply_once_sync(&mut conn, consumer, event_id, |conn| {
                diesel::sql_query(format!(
                    "INSERT INTO {effects} (partition_key, event_id) VALUES ($1, $2)"
                ))
                .bind::<Text, _>(consumer)
                .bind::<SqlUuid, _>(*event_id.as_uuid())
                .execute(conn)?;
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
    assert_eq!(
        db.effects().await,
        [
            ("billing".to_string(), first),
            ("billing".to_string(), second),
            ("revenue".to_string(), first)
        ],
        "each consumer applied each event once; the failed attempt left nothing"
    );
    // The claims are the inbox's: the sqlx inbox sees them as duplicates.
    let inbox = db.store.inbox();
    let mut tx = inbox.begin().await.unwrap();
    assert!(!inbox.claim(&mut tx, "billing", second).await.unwrap());
    inbox.rollback(tx).await.unwrap();
}

#[cfg(feature = "diesel-sync")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_once_sync_on_a_pg_connection_applies_each_event_once() {
    apply_once_sync_applies_each_event_once(libpq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_once_sync_on_the_async_connection_wrapper_applies_each_event_once() {
    apply_once_sync_applies_each_event_once(wrapped).await;
}

/// Async `migrate` on a fresh schema creates the tables, then reports them
/// current; tables of another version are refused untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_migrate_reports_and_checks_the_schema_version() {
    let db = EndToEndDb::create("diesel").await;
    let outbox = outbox_in(&db.schema);
    let mut conn = connect().await;
    let current = outbox.migrate(&mut conn).await.unwrap();
    assert_eq!((current.found, current.version), (Some(2), 2));
    conn.batch_execute(&format!(
        "UPDATE {}.outbox_schema_version SET version = 1",
        db.schema
    ))
    .await
    .unwrap();
    let refused = outbox.migrate(&mut conn).await.unwrap_err();
    assert!(!refused.is_retryable());
    assert!(
        refused
            .to_string()
            .contains("Upgrading to schema version 2"),
        "{refused}"
    );
}

/// Inbox claims are one table: a claim committed through Diesel is a
/// duplicate to the sqlx inbox, and the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_claims_written_by_one_orm_are_seen_by_the_other() {
    let db = EndToEndDb::create("diesel").await;
    let pool = diesel_async::pooled_connection::deadpool::Pool::builder(
        diesel_async::pooled_connection::AsyncDieselConnectionManager::<AsyncPgConnection>::new(
            url(),
        ),
    )
    .max_size(2)
    .build()
    .unwrap();
    let diesel_store = outbox_diesel::postgres::PgStore::new(
        pool,
        StoreConfig::with_tables(TableNames::default().in_schema(&db.schema).unwrap()),
    );
    let (diesel_inbox, sqlx_inbox) = (diesel_store.inbox(), db.store.inbox());
    outbox_tests::assert_inbox_claims_are_shared(&diesel_inbox, &sqlx_inbox).await;
}
