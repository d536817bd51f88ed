//! A relay that cannot work stops by itself with the store's error
//! (DESIGN.md §6) instead of logging a warning forever.

use std::str::FromStr;
use std::time::Duration;

use outbox_core::testing::relay_suite::stops_on_a_store_that_cannot_work;
use sqlx::mysql::MySqlConnectOptions;

use super::*;

#[tokio::test]
async fn over_tables_never_migrated() {
    let pool = pool().await;
    let database = support::unique_name("outbox_t");
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&pool)
        .await
        .unwrap();
    let tables = TableNames::default().in_schema(&database).unwrap();
    let store = MySqlStore::new(pool, StoreConfig::with_tables(tables));
    stops_on_a_store_that_cannot_work(Arc::new(store), "run migrate()").await;
}

#[tokio::test]
async fn over_the_wrong_database() {
    let missing = support::unique_name("no_such_database");
    let options = MySqlConnectOptions::from_str(&url())
        .unwrap()
        .database(&missing);
    let pool = MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options);
    let store = MySqlStore::new(pool, StoreConfig::default());
    stops_on_a_store_that_cannot_work(Arc::new(store), "Unknown database").await;
}
