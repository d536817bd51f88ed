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
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub mod set_aside;
pub mod tenants;

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

/// Opens `n` connections of `pool` at once and returns them to it, so a
/// timed operation afterwards measures the database, not a connect.
pub async fn warm<DB: sqlx::Database>(pool: &sqlx::Pool<DB>, n: usize) {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(pool.acquire().await.expect("a pooled connection"));
    }
}

#[allow(unused_imports)]
pub use outbox_sql::testing::three_deploys_beside_a_producer;
