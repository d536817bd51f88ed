//! A relay that cannot work stops by itself with the store's error
//! (DESIGN.md §6) instead of logging a warning forever.

use std::str::FromStr;
use std::time::Duration;

use outbox_core::testing::relay_suite::stops_on_a_store_that_cannot_work;
use sqlx::postgres::PgConnectOptions;

use super::*;

fn lazy_pool(options: PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options)
}

#[tokio::test]
async fn over_tables_never_migrated() {
    let pool = pool().await;
    let schema = support::unique_name("t");
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&pool)
        .await
        .unwrap();
    let tables = TableNames::default().in_schema(&schema).unwrap();
    let store = PgStore::new(pool, StoreConfig::with_tables(tables));
    stops_on_a_store_that_cannot_work(Arc::new(store), "run migrate()").await;
}

#[tokio::test]
async fn over_the_wrong_database() {
    let missing = support::unique_name("no_such_database");
    let options = PgConnectOptions::from_str(&url())
        .unwrap()
        .database(&missing);
    let store = PgStore::new(lazy_pool(options), StoreConfig::default());
    stops_on_a_store_that_cannot_work(Arc::new(store), "does not exist").await;
}

#[tokio::test]
async fn as_a_role_without_rights() {
    let (_owner, schema) = store_in_schema(ManualClock::at_epoch()).await;
    let admin = pool().await;
    let role = support::unique_name("no_rights");
    sqlx::query(&format!("CREATE ROLE {role} LOGIN"))
        .execute(&admin)
        .await
        .unwrap();
    let options = PgConnectOptions::from_str(&url()).unwrap().username(&role);
    let pool = lazy_pool(options);
    let tables = TableNames::default().in_schema(&schema).unwrap();
    let store = PgStore::new(pool.clone(), StoreConfig::with_tables(tables));
    stops_on_a_store_that_cannot_work(Arc::new(store), "permission denied").await;
    pool.close().await;
    sqlx::query(&format!("DROP ROLE {role}"))
        .execute(&admin)
        .await
        .unwrap();
}
