//! The core's store, relay and inbox suites against live MariaDB through
//! diesel-async (`OUTBOX_MYSQL_URL`, default root on loopback), one
//! database per test: the Diesel store keeps every promise the sqlx one
//! does, on the same protocol.

use std::sync::Arc;

use async_trait::async_trait;
use diesel::sql_types::Text;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use futures::future::BoxFuture;
use outbox_core::testing::InboxHarness;
use outbox_core::{EventId, ManualClock, StoreError, StoreTime};
use outbox_diesel::mysql::{MysqlInbox, MysqlInboxTx, MysqlStore};
use outbox_diesel::{StoreConfig, TableNames};

fn url() -> String {
    std::env::var("OUTBOX_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

fn pool() -> Pool<AsyncMysqlConnection> {
    Pool::builder(AsyncDieselConnectionManager::<AsyncMysqlConnection>::new(
        url(),
    ))
    .max_size(10)
    .build()
    .expect("a pool")
}

/// A migrated store in a fresh database of its own (dropped by
/// `scripts/services.sh` on the next run), on `clock`'s store time; and the
/// database's name.
async fn store_in_database(clock: ManualClock) -> (MysqlStore, String) {
    let pool = pool();
    let database = format!(
        "outbox_t_dsl_{}",
        &EventId::random().as_uuid().simple().to_string()[..12]
    );
    let mut conn = pool
        .get()
        .await
        .unwrap_or_else(|e| panic!("MariaDB unreachable at {}: {e}", url()));
    conn.batch_execute(&format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    drop(conn);
    let store = MysqlStore::new(
        pool,
        StoreConfig::with_tables(TableNames::default().in_schema(&database).unwrap())
            .with_clock(Arc::new(clock.clone()))
            .with_time(StoreTime::Shifted(clock)),
    );
    store.migrate().await.unwrap();
    (store, database)
}

fn diesel_store(clock: ManualClock) -> BoxFuture<'static, Arc<MysqlStore>> {
    Box::pin(async move { Arc::new(store_in_database(clock).await.0) })
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
    inbox: MysqlInbox,
    pool: Pool<AsyncMysqlConnection>,
    effects: String,
    clock: ManualClock,
}

#[derive(diesel::QueryableByName)]
struct Effect {
    #[diesel(sql_type = Text)]
    event_id: String,
}

fn record_effect(
    effects: &str,
    consumer: &str,
    event_id: EventId,
) -> impl diesel_async::methods::ExecuteDsl<AsyncMysqlConnection> {
    diesel::sql_query(format!(
        "INSERT INTO {effects} (consumer, event_id) VALUES (?, ?)"
    ))
    .bind::<Text, _>(consumer.to_owned())
    .bind::<Text, _>(event_id.to_string())
}

#[async_trait]
impl InboxHarness for DieselInboxHarness {
    type Inbox = MysqlInbox;
    fn inbox(&self) -> &MysqlInbox {
        &self.inbox
    }
    async fn apply_effect(
        &self,
        tx: &mut MysqlInboxTx,
        consumer: &str,
        event_id: EventId,
    ) -> Result<(), StoreError> {
        record_effect(&self.effects, consumer, event_id)
            .execute(&mut **tx)
            .await
            .map_err(StoreError::fatal)?;
        Ok(())
    }
    async fn effects(&self, consumer: &str) -> Result<Vec<EventId>, StoreError> {
        let mut conn = self.pool.get().await.map_err(StoreError::fatal)?;
        let rows: Vec<Effect> = diesel::sql_query(format!(
            "SELECT event_id FROM {} WHERE consumer = ? ORDER BY seq",
            self.effects
        ))
        .bind::<Text, _>(consumer)
        .load(&mut conn)
        .await
        .map_err(StoreError::fatal)?;
        rows.into_iter()
            .map(|r| r.event_id.parse().map_err(StoreError::fatal))
            .collect()
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

fn diesel_inbox(clock: ManualClock) -> BoxFuture<'static, Arc<DieselInboxHarness>> {
    Box::pin(async move {
        let (store, database) = store_in_database(clock.clone()).await;
        let effects = format!("{database}.effects");
        let mut conn = store.pool().get().await.unwrap();
        conn.batch_execute(&format!(
            "CREATE TABLE {effects} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \
             consumer VARCHAR(255) NOT NULL, event_id CHAR(36) NOT NULL) ENGINE = InnoDB"
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
        async move |conn: &mut AsyncMysqlConnection| {
            record_effect(&effects, consumer, event_id)
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

/// A store operation cut off at any await point (an aborted relay task, a
/// drain timeout, a `select!`) leaves no pooled connection inside a
/// transaction and none out of step with the server (the sqlx store's
/// driver needed tasks of its own for that; diesel-async marks a
/// connection cut mid-transaction broken and deadpool discards it).
#[tokio::test]
async fn operations_cut_off_anywhere_leave_no_transaction_open() {
    use diesel::sql_types::BigInt;
    use outbox_core::testing::cut_store_operations;

    let (migrated, _) = store_in_database(ManualClock::at_epoch()).await;
    // One connection: the one a cut operation left behind is the one the
    // check reads.
    let one = Pool::builder(AsyncDieselConnectionManager::<AsyncMysqlConnection>::new(
        url(),
    ))
    .max_size(1)
    .build()
    .expect("a pool");
    let store = MysqlStore::new(one.clone(), migrated.config().clone());
    let in_transaction = |operation: &'static str, cut: usize| {
        let one = one.clone();
        async move {
            let mut conn = tokio::time::timeout(std::time::Duration::from_secs(5), one.get())
                .await
                .unwrap_or_else(|_| panic!("{operation} cut at await {cut} kept the connection"))
                .unwrap();
            let open: i64 = diesel::select(diesel::dsl::sql::<BigInt>(
                "CAST(@@in_transaction AS SIGNED)",
            ))
            .get_result(&mut *conn)
            .await
            .unwrap();
            assert_eq!(
                open, 0,
                "{operation} cut at await {cut} left a transaction open"
            );
        }
    };
    cut_store_operations(&store, 10, in_transaction).await;
}

/// A relay over a database whose tables were never migrated stops at once
/// with an error that says what to do (run migrate).
#[tokio::test]
async fn a_relay_over_tables_never_migrated_stops_saying_run_migrate() {
    let pool = pool();
    let database = format!(
        "outbox_t_dsl_{}",
        &EventId::random().as_uuid().simple().to_string()[..12]
    );
    pool.get()
        .await
        .unwrap_or_else(|e| panic!("MariaDB unreachable at {}: {e}", url()))
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    let store = MysqlStore::new(
        pool,
        StoreConfig::with_tables(TableNames::default().in_schema(&database).unwrap()),
    );
    outbox_core::testing::relay_suite::stops_on_a_store_that_cannot_work(
        Arc::new(store),
        "run migrate()",
    )
    .await;
}
