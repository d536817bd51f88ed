//! The shared PostgreSQL server, and stores on it in schemas of their own.
use std::sync::Arc;

use outbox_core::{ManualClock, StoreTime};
use outbox_sqlx::postgres::PgStore;
use outbox_sqlx::{StoreConfig, TableNames};
use sqlx::postgres::{PgPool, PgPoolOptions};

pub fn shared_url() -> String {
    std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".into())
}

pub async fn connect(url: &str) -> PgPool {
    match outbox_sqlx::guard_cancelled_transactions(PgPoolOptions::new())
        .max_connections(8)
        .connect(url)
        .await
    {
        Ok(pool) => pool,
        Err(e) => super::unreachable("PostgreSQL", url, e),
    }
}

/// A migrated store in a fresh schema of the shared server, on a shifted
/// store clock.
pub async fn shared_store(clock: ManualClock) -> (PgStore, String) {
    let pool = connect(&shared_url()).await;
    let schema = super::unique_name("s");
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&pool)
        .await
        .unwrap();
    let tables = TableNames::default().in_schema(&schema).unwrap();
    let store = PgStore::new(
        pool,
        StoreConfig::with_tables(tables)
            .with_clock(Arc::new(clock.clone()))
            .with_time(StoreTime::Shifted(clock)),
    );
    store.migrate().await.unwrap();
    (store, schema)
}
