//! The core's store, relay and inbox suites against live PostgreSQL through
//! diesel-async: the Diesel store keeps every promise the sqlx one does.

use std::sync::Arc;

use async_trait::async_trait;
use diesel::sql_types::{Text, Uuid as SqlUuid};
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures::future::BoxFuture;
use outbox_core::testing::InboxHarness;
use outbox_core::{EventId, ManualClock, StoreError, StoreTime};
use outbox_diesel::postgres::{PgInbox, PgInboxTx, PgStore};
use outbox_diesel::{StoreConfig, TableNames};

fn url() -> String {
    std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".into())
}

fn pool() -> Pool<AsyncPgConnection> {
    Pool::builder(AsyncDieselConnectionManager::<AsyncPgConnection>::new(url()))
        .max_size(8)
        .build()
        .expect("a pool")
}

/// A migrated store in a fresh schema of its own, on `clock`'s store time;
/// and the schema's name.
async fn store_in_schema(clock: ManualClock) -> (PgStore, String) {
    let pool = pool();
    let schema = format!(
        "dsl_{}",
        &EventId::random().as_uuid().simple().to_string()[..12]
    );
    let mut conn = pool
        .get()
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL unreachable at {}: {e}", url()));
    conn.batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    drop(conn);
    let store = PgStore::new(
        pool,
        StoreConfig::with_tables(TableNames::default().in_schema(&schema).unwrap())
            .with_clock(Arc::new(clock.clone()))
            .with_time(StoreTime::Shifted(clock)),
    );
    store.migrate().await.unwrap();
    (store, schema)
}

fn diesel_store(clock: ManualClock) -> BoxFuture<'static, Arc<PgStore>> {
    Box::pin(async move { Arc::new(store_in_schema(clock).await.0) })
}

mod store {
    outbox_core::store_conformance_tests!(super::diesel_store);
    outbox_core::commit_order_conformance_tests!(super::diesel_store);
}

mod failure {
    outbox_core::failure_conformance_tests!(super::diesel_store);
}

mod relay {
    outbox_core::relay_conformance_tests!(super::diesel_store);
}

/// The inbox plus an effects table written with Diesel in the same
/// transaction.
struct DieselInboxHarness {
    inbox: PgInbox,
    pool: Pool<AsyncPgConnection>,
    effects: String,
    clock: ManualClock,
}

#[derive(diesel::QueryableByName)]
struct Effect {
    #[diesel(sql_type = SqlUuid)]
    event_id: uuid::Uuid,
}

#[async_trait]
impl InboxHarness for DieselInboxHarness {
    type Inbox = PgInbox;
    fn inbox(&self) -> &PgInbox {
        &self.inbox
    }
    async fn apply_effect(
        &self,
        tx: &mut PgInboxTx,
        consumer: &str,
        event_id: EventId,
    ) -> Result<(), StoreError> {
        diesel::sql_query(format!(
            "INSERT INTO {} (consumer, event_id) VALUES ($1, $2)",
            self.effects
        ))
        .bind::<Text, _>(consumer)
        .bind::<SqlUuid, _>(*event_id.as_uuid())
        .execute(&mut **tx)
        .await
        .map_err(StoreError::fatal)?;
        Ok(())
    }
    async fn effects(&self, consumer: &str) -> Result<Vec<EventId>, StoreError> {
        let mut conn = self.pool.get().await.map_err(StoreError::fatal)?;
        let rows: Vec<Effect> = diesel::sql_query(format!(
            "SELECT event_id FROM {} WHERE consumer = $1 ORDER BY seq",
            self.effects
        ))
        .bind::<Text, _>(consumer)
        .load(&mut conn)
        .await
        .map_err(StoreError::fatal)?;
        Ok(rows
            .into_iter()
            .map(|r| EventId::from_uuid(r.event_id))
            .collect())
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

fn diesel_inbox(clock: ManualClock) -> BoxFuture<'static, Arc<DieselInboxHarness>> {
    Box::pin(async move {
        let (store, schema) = store_in_schema(clock.clone()).await;
        let effects = format!("{schema}.effects");
        let mut conn = store.pool().get().await.unwrap();
        conn.batch_execute(&format!(
            "CREATE TABLE {effects} (seq BIGSERIAL PRIMARY KEY, consumer TEXT NOT NULL, event_id UUID NOT NULL)"
        ))
        .await
        .unwrap();
        drop(conn);
        Arc::new(DieselInboxHarness {
            inbox: store.inbox(),
            pool: store.pool().clone(),
            effects,
            clock,
        })
    })
}

mod inbox {
    outbox_core::inbox_conformance_tests!(super::diesel_inbox);
}

/// `apply_once` in Diesel's closure style: the effect runs once per
/// consumer; a redelivery runs nothing; a failing effect rolls its claim
/// back, so the next delivery applies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_once_runs_the_effect_once_and_a_failure_leaves_no_claim() {
    let harness = diesel_inbox(ManualClock::at_epoch()).await;
    let (inbox, effects) = (&harness.inbox, harness.effects.clone());
    let record = |consumer: &'static str, event_id: EventId, fail: bool| {
        let effects = effects.clone();
        async move |conn: &mut AsyncPgConnection| {
            diesel::sql_query(format!(
                "INSERT INTO {effects} (consumer, event_id) VALUES ($1, $2)"
            ))
            .bind::<Text, _>(consumer)
            .bind::<SqlUuid, _>(*event_id.as_uuid())
            .execute(conn)
            .await?;
            if fail {
                return Err(outbox_diesel::Error::Outbox(StoreError::Config(
                    "the handler gave up".into(),
                )));
            }
            Ok(())
        }
    };
    let (first, second) = (EventId::random(), EventId::random());
    assert_eq!(
        inbox
            .apply_once("billing", first, record("billing", first, false))
            .await
            .unwrap(),
        Some(())
    );
    assert_eq!(
        inbox
            .apply_once("billing", first, record("billing", first, false))
            .await
            .unwrap(),
        None,
        "a redelivery runs nothing"
    );
    assert!(
        inbox
            .apply_once("billing", second, record("billing", second, true))
            .await
            .is_err()
    );
    assert_eq!(
        inbox
            .apply_once("billing", second, record("billing", second, false))
            .await
            .unwrap(),
        Some(()),
        "the failed attempt left no claim"
    );
    assert_eq!(
        harness.effects("billing").await.unwrap(),
        vec![first, second]
    );
}

/// A relay over a schema whose tables were never migrated stops at once
/// with an error that says what to do (run migrate), not "function …
/// does not exist".
#[tokio::test]
async fn a_relay_over_tables_never_migrated_stops_saying_run_migrate() {
    let pool = pool();
    let schema = format!(
        "dsl_{}",
        &EventId::random().as_uuid().simple().to_string()[..12]
    );
    pool.get()
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL unreachable at {}: {e}", url()))
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let store = PgStore::new(
        pool,
        StoreConfig::with_tables(TableNames::default().in_schema(&schema).unwrap()),
    );
    outbox_core::testing::relay_suite::stops_on_a_store_that_cannot_work(
        Arc::new(store),
        "run migrate()",
    )
    .await;
}

/// migrate() on current tables takes no lock a producer can queue behind:
/// while a report holds the events table open, three instances' migrate()
/// return at once and an enqueue beside them commits within 100 ms
/// (Diesel's migrate re-ran its DDL too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_on_current_tables_takes_no_lock_producers_queue_behind() {
    use diesel_async::AsyncConnection;
    let (store, schema) = store_in_schema(ManualClock::at_epoch()).await;
    // Connections opened first: the enqueue below measures the database.
    let mut warm = Vec::new();
    for _ in 0..6 {
        warm.push(store.pool().get().await.unwrap());
    }
    drop(warm);
    let mut report = pool().get().await.unwrap();
    report.batch_execute("BEGIN").await.unwrap();
    report
        .batch_execute(&format!("SELECT count(*) FROM {schema}.outbox_events"))
        .await
        .unwrap();
    // Three instances of the application start at once.
    outbox_sql::testing::three_deploys_beside_a_producer(
        || {
            let store = store.clone();
            async move { store.migrate().await }
        },
        || async {
            let mut conn = store.pool().get().await.unwrap();
            conn.transaction::<_, outbox_diesel::Error, _>(async |conn| {
                store
                    .outbox()
                    .enqueue(conn, &[outbox_core::testing::event("a", 1)])
                    .await?;
                Ok(())
            })
            .await
        },
    )
    .await;
    report.batch_execute("ROLLBACK").await.unwrap();
}
