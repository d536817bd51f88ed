//! Shared by the live-database tests.
#![allow(dead_code)]

/// A random lowercase name for per-test isolation.
pub fn unique_name(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// The database is required: a test that cannot reach it fails (under CI
/// and locally alike). Set `OUTBOX_SKIP_UNAVAILABLE=1` to skip instead,
/// which is refused when `CI=true`.
pub fn unreachable(service: &str, url: &str, error: impl std::fmt::Display) -> ! {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let skip = std::env::var("OUTBOX_SKIP_UNAVAILABLE").is_ok_and(|v| v == "1");
    if skip && !ci {
        eprintln!("SKIPPED: {service} unreachable at {url}: {error}");
        std::process::exit(0);
    }
    panic!("{service} unreachable at {url}: {error} (start it with scripts/services.sh)");
}
#[cfg(feature = "postgres")]
pub mod pg;

/// On a store whose pool was closed: `stats` and the inbox's `begin` fail
/// as unavailable, and each error names its operation and table once.
pub async fn assert_closed_pool_errors_name_their_operation<S, I>(
    store: &S,
    inbox: &I,
    events_table: &str,
    inbox_table: &str,
) where
    S: outbox_core::store::OutboxAdmin,
    I: outbox_core::InboxStore,
{
    let error = store.stats().await.unwrap_err();
    assert!(
        error.is_retryable(),
        "a closed pool is unavailable: {error}"
    );
    outbox_core::testing::assert_names_the_operation_once(&error, "stats", events_table);
    let Err(error) = inbox.begin().await else {
        panic!("begin on a closed pool succeeded");
    };
    outbox_core::testing::assert_names_the_operation_once(&error, "inbox begin", inbox_table);
}

/// How long a producer's enqueue and commit may take while three
/// application instances call `migrate()` on current tables beside a
/// report holding the events table open (the bound).
pub const PRODUCER_BESIDE_MIGRATE: std::time::Duration = std::time::Duration::from_millis(100);

/// Opens `n` connections of `pool` at once and returns them to it, so a
/// timed operation afterwards measures the database, not a connect.
pub async fn warm<DB: sqlx::Database>(pool: &sqlx::Pool<DB>, n: usize) {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(pool.acquire().await.expect("a pooled connection"));
    }
}

/// Three instances call `migrate()` at once (`deploy`) while `enqueue`
/// commits an unrelated event, all beside a report the caller holds open on
/// the events table: every migrate() returns at the current version, and
/// the enqueue commits within [`PRODUCER_BESIDE_MIGRATE`].
pub async fn three_deploys_beside_a_producer<M, F, E>(deploy: M, enqueue: E)
where
    M: Fn() -> F,
    F: std::future::Future<Output = Result<outbox_sqlx::Migrated, outbox_core::StoreError>>
        + Send
        + 'static,
    E: std::future::Future<Output = Result<(), outbox_core::StoreError>>,
{
    use std::time::{Duration, Instant};
    let deploys: Vec<_> = (0..3).map(|_| tokio::spawn(deploy())).collect();
    let started = Instant::now();
    let enqueued = tokio::time::timeout(Duration::from_secs(3), enqueue).await;
    let waited = started.elapsed();
    for deploy in deploys {
        let migrated = tokio::time::timeout(Duration::from_secs(3), deploy)
            .await
            .expect("migrate() returned while the report was open")
            .unwrap()
            .unwrap();
        assert_eq!(migrated.found, Some(2));
    }
    assert!(
        matches!(enqueued, Ok(Ok(()))),
        "a producer queued behind migrate(): {enqueued:?}"
    );
    assert!(
        waited < PRODUCER_BESIDE_MIGRATE,
        "the enqueue took {waited:?} beside three migrate() calls"
    );
}
