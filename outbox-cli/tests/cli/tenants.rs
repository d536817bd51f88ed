//! `outbox status --all-tenants` and `--tenant-urls`: a schema per tenant
//! on the shared PostgreSQL, a database per tenant on the shared MariaDB.

use super::*;

/// `status --all-tenants PATTERN`: a line per tenant schema and the sum,
/// in text and JSON; refused beside `--schema`.
#[tokio::test]
async fn status_over_every_tenant_schema() {
    use outbox_core::OutboxWriter;
    use outbox_sqlx::postgres::PgStore;
    use outbox_sqlx::{StoreConfig, TableNames};

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg_url())
        .await
        .unwrap();
    let prefix = format!("st_{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    for (tenant, events) in [("a", 3), ("b", 2)] {
        let schema = format!("{prefix}_{tenant}");
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&pool)
            .await
            .unwrap();
        let tables = TableNames::default().in_schema(&schema).unwrap();
        let store = PgStore::new(pool.clone(), StoreConfig::with_tables(tables));
        store.migrate().await.unwrap();
        let batch: Vec<_> = (0..events)
            .map(|n| outbox_core::testing::event("k", n))
            .collect();
        OutboxWriter::enqueue(&store, &batch).await.unwrap();
    }
    let pattern = format!("{prefix}_%");
    let url = pg_url();
    let report = outbox(
        &url,
        &["--output", "json", "status", "--all-tenants", &pattern],
    )
    .await;
    assert!(report.status.success(), "{}", stderr(&report));
    let report = json(&report);
    let claimable: Vec<(String, u64)> = report["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["tenant"].as_str().unwrap().to_owned(),
                t["totals"]["claimable"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        claimable,
        [(format!("{prefix}_a"), 3), (format!("{prefix}_b"), 2)]
    );
    assert_eq!(report["all"]["claimable"], 5);
    let text = outbox(&url, &["status", "--all-tenants", &pattern]).await;
    assert!(stdout(&text).contains("all 2 tenants"), "{}", stdout(&text));
    // Named by URL, a tenant whose database does not exist on its line.
    let rows = format!(
        "SELECT 'acme', '{url}', '{prefix}_a' UNION ALL SELECT 'gone', '{gone}', NULL",
        gone = url.rsplit_once('/').unwrap().0.to_owned() + "/no_such_database_st",
    );
    let report = outbox(
        &url,
        &["--output", "json", "status", "--tenant-urls", &rows],
    )
    .await;
    assert!(report.status.success(), "{}", stderr(&report));
    let report = json(&report);
    assert_eq!(report["tenants"][0]["tenant"], "acme");
    assert_eq!(report["tenants"][0]["totals"]["claimable"], 3);
    assert_eq!(report["tenants"][1]["tenant"], "gone");
    let error = report["tenants"][1]["error"].as_str().unwrap();
    assert!(error.contains("no_such_database_st"), "{error}");
    assert_eq!(report["all"]["claimable"], 3);
    let refused = outbox(
        &url,
        &["--schema", "x", "status", "--all-tenants", &pattern],
    )
    .await;
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("remove --schema"),
        "{}",
        stderr(&refused)
    );
    for tenant in ["a", "b"] {
        sqlx::query(&format!("DROP SCHEMA {prefix}_{tenant} CASCADE"))
            .execute(&pool)
            .await
            .unwrap();
    }
}

/// The same on MariaDB, a database per tenant.
#[tokio::test]
async fn status_over_every_tenant_database() {
    use outbox_core::OutboxWriter;
    use outbox_sqlx::mysql::MySqlStore;
    use outbox_sqlx::{StoreConfig, TableNames};

    let url =
        std::env::var("OUTBOX_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into());
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    let prefix = format!(
        "outbox_t_st_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    for (tenant, events) in [("a", 1), ("b", 4)] {
        let database = format!("{prefix}_{tenant}");
        sqlx::query(&format!("CREATE DATABASE {database}"))
            .execute(&pool)
            .await
            .unwrap();
        let tables = TableNames::default().in_schema(&database).unwrap();
        let store = MySqlStore::new(pool.clone(), StoreConfig::with_tables(tables));
        store.migrate().await.unwrap();
        let batch: Vec<_> = (0..events)
            .map(|n| outbox_core::testing::event("k", n))
            .collect();
        OutboxWriter::enqueue(&store, &batch).await.unwrap();
    }
    let pattern = format!("{prefix}\\_%");
    let report = outbox(
        &url,
        &["--output", "json", "status", "--all-tenants", &pattern],
    )
    .await;
    assert!(report.status.success(), "{}", stderr(&report));
    let report = json(&report);
    let tenants: Vec<&str> = report["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, [format!("{prefix}_a"), format!("{prefix}_b")]);
    assert_eq!(report["all"]["claimable"], 5);
    // Named by URL: the database in each one's URL, one pool per server.
    let rows = format!("SELECT 'b', '{url}/{prefix}_b'");
    let report = outbox(
        &url,
        &["--output", "json", "status", "--tenant-urls", &rows],
    )
    .await;
    assert!(report.status.success(), "{}", stderr(&report));
    assert_eq!(json(&report)["all"]["claimable"], 4);
    for tenant in ["a", "b"] {
        sqlx::query(&format!("DROP DATABASE {prefix}_{tenant}"))
            .execute(&pool)
            .await
            .unwrap();
    }
}
