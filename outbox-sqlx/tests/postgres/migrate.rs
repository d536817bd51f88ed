//! `migrate()` on a live server: the schema version reported and checked,
//! and what a migration holds while producers write.

use super::*;

/// `migrate` reports the version it found; tables of another schema version
/// are refused before anything changes, naming the upgrade notes.
#[tokio::test]
pub(super) async fn migrate_reports_and_checks_the_schema_version() {
    let (store, schema) = store_in_schema(ManualClock::at_epoch()).await;
    assert_eq!(store.schema_version().await.unwrap(), Some(2));
    let again = store.migrate().await.unwrap();
    assert_eq!((again.found, again.version), (Some(2), 2));
    assert!(!again.created());

    sqlx::query(&format!(
        "UPDATE {schema}.outbox_schema_version SET version = 1"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let refused = store.migrate().await.unwrap_err();
    assert!(!refused.is_retryable());
    let message = refused.to_string();
    assert!(
        message.contains("schema version 1") && message.contains("Upgrading to schema version 2"),
        "{message}"
    );
    assert_eq!(store.schema_version().await.unwrap(), Some(1), "untouched");

    let fresh = support::unique_name("t");
    sqlx::query(&format!("CREATE SCHEMA {fresh}"))
        .execute(store.pool())
        .await
        .unwrap();
    let empty = PgStore::new(
        store.pool().clone(),
        StoreConfig::with_tables(TableNames::default().in_schema(&fresh).unwrap()),
    );
    assert_eq!(empty.schema_version().await.unwrap(), None);
    assert!(empty.migrate().await.unwrap().created());
}

/// migrate() on current tables (every deploy calls it at start-up) takes no
/// lock a producer can queue behind: while a report holds the events table
/// open, migrate() returns at once and an enqueue beside it goes through.
/// Before, migrate() re-ran its DDL (DROP/CREATE TRIGGER, ALTER TABLE)
/// with no lock timeout: it queued for ACCESS EXCLUSIVE behind the report
/// and every producer queued behind it (12.3 s in the run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn migrate_on_current_tables_takes_no_lock_producers_queue_behind() {
    use outbox_core::OutboxWriter;
    let (store, schema) = store_in_schema(ManualClock::at_epoch()).await;
    support::warm(store.pool(), 6).await;
    let mut report = store.pool().begin().await.unwrap();
    sqlx::query(&format!("SELECT count(*) FROM {schema}.outbox_events"))
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

/// migrate() with DDL to run (another release's schema) while a report
/// holds the table: it waits at most a second per lock and retries, so a
/// producer meanwhile waits at most that second, and it completes once the
/// report ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn migrate_with_ddl_to_run_never_holds_producers_long() {
    use outbox_core::OutboxWriter;
    let (store, schema) = store_in_schema(ManualClock::at_epoch()).await;
    sqlx::query(&format!(
        "UPDATE {schema}.outbox_schema_applied SET fingerprint = 'an earlier release'"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let mut report = store.pool().begin().await.unwrap();
    sqlx::query(&format!("SELECT count(*) FROM {schema}.outbox_events"))
        .fetch_one(&mut *report)
        .await
        .unwrap();
    let deploy = tokio::spawn({
        let store = store.clone();
        async move { store.migrate().await }
    });
    // Until migrate()'s DDL waits for its lock behind the report.
    let waiting = format!(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = '{schema}.outbox_events'::regclass"
    );
    while sqlx::query_scalar::<_, i64>(&waiting)
        .fetch_one(store.pool())
        .await
        .unwrap()
        == 0
    {
        tokio::task::yield_now().await;
    }
    let started = std::time::Instant::now();
    OutboxWriter::enqueue(&store, &[event("a", 1)])
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited < std::time::Duration::from_millis(1_800),
        "a producer waited {waited:?} behind migrate()"
    );
    report.rollback().await.unwrap();
    let migrated = tokio::time::timeout(std::time::Duration::from_secs(30), deploy)
        .await
        .expect("migrate() completes once the report ends")
        .unwrap()
        .unwrap();
    assert_eq!(migrated.found, Some(2));
    let applied: String = sqlx::query_scalar(&format!(
        "SELECT fingerprint FROM {schema}.outbox_schema_applied"
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_ne!(applied, "an earlier release");
}
