//! Diesel's embedded MySQL migration builds exactly the tables, columns,
//! indexes, constraints and seed rows the sqlx store's `migrate` builds:
//! the two catalogs are compared on live MariaDB. Reverting it (down.sql,
//! generated from up.sql by `scripts/render-migrations.py`) leaves nothing.

use diesel::Connection;
use diesel_async::AsyncMysqlConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_migrations::MigrationHarness;
use outbox_core::EventId;
use outbox_diesel::mysql::MIGRATIONS;
use outbox_sqlx::mysql::MySqlStore;
use sqlx::Row;

fn url() -> String {
    std::env::var("OUTBOX_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

/// A database name `scripts/services.sh` drops on its next run.
fn fresh_database(stem: &str) -> String {
    format!(
        "outbox_t_{stem}_{}",
        &EventId::random().as_uuid().simple().to_string()[..12]
    )
}

/// One catalog of the outbox tables in `database`, each entry as text.
async fn catalog(pool: &sqlx::MySqlPool, database: &str) -> Vec<String> {
    let queries = [
        "SELECT CONCAT_WS(' ', 'table', table_name, engine, table_collation)
         FROM information_schema.tables
         WHERE table_schema = ? AND table_name LIKE 'outbox\\_%'",
        "SELECT CONCAT_WS(' ', 'column', table_name, column_name, ordinal_position, column_type,
                          is_nullable, COALESCE(column_default, '-'), extra,
                          COALESCE(collation_name, '-'))
         FROM information_schema.columns
         WHERE table_schema = ? AND table_name LIKE 'outbox\\_%'",
        "SELECT CONCAT_WS(' ', 'index', table_name, index_name, non_unique, seq_in_index,
                          column_name, COALESCE(sub_part, '-'))
         FROM information_schema.statistics
         WHERE table_schema = ? AND table_name LIKE 'outbox\\_%'",
        "SELECT CONCAT_WS(' ', 'check', table_name, constraint_name, check_clause)
         FROM information_schema.check_constraints
         WHERE constraint_schema = ? AND table_name LIKE 'outbox\\_%'",
        "SELECT CONCAT_WS(' ', 'trigger', event_object_table, trigger_name, event_manipulation,
                          action_timing, action_statement)
         FROM information_schema.triggers WHERE trigger_schema = ?",
    ];
    let mut entries = Vec::new();
    for query in queries {
        for row in sqlx::query(query)
            .bind(database)
            .fetch_all(pool)
            .await
            .unwrap()
        {
            let entry: String = row.get(0);
            entries.push(entry.replace(&format!("{database}."), ""));
        }
    }
    // The seed rows the protocol needs (clock, claim lock, version).
    for (table, columns) in [
        ("outbox_clock", "id, clock_shift_us"),
        ("outbox_claim_lock", "id"),
        ("outbox_schema_version", "version"),
    ] {
        for row in sqlx::query(&format!(
            "SELECT CAST(CONCAT_WS(' ', {columns}) AS CHAR) FROM {database}.{table}"
        ))
        .fetch_all(pool)
        .await
        .unwrap()
        {
            let values: String = row.get(0);
            entries.push(format!("row {table} {values}"));
        }
    }
    entries.sort();
    entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diesel_migrations_and_the_sqlx_migrate_build_the_same_mysql_catalog() {
    let (by_diesel, by_sqlx) = (fresh_database("dmig"), fresh_database("smig"));
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .connect(&url())
        .await
        .unwrap_or_else(|e| panic!("MariaDB unreachable at {}: {e}", url()));
    for database in [&by_diesel, &by_sqlx] {
        sqlx::query(&format!("CREATE DATABASE {database}"))
            .execute(&pool)
            .await
            .unwrap();
    }
    tokio::task::spawn_blocking({
        let url = format!("{}/{by_diesel}", url());
        move || {
            let mut conn = AsyncConnectionWrapper::<AsyncMysqlConnection>::establish(&url)
                .unwrap_or_else(|e| panic!("MariaDB unreachable at {url}: {e}"));
            let applied = conn.run_pending_migrations(MIGRATIONS).unwrap();
            assert_eq!(applied.len(), 1, "one migration");
        }
    })
    .await
    .unwrap();
    MySqlStore::new(
        pool.clone(),
        outbox_sqlx::StoreConfig::with_tables(
            outbox_sqlx::TableNames::default()
                .in_schema(&by_sqlx)
                .unwrap(),
        ),
    )
    .migrate()
    .await
    .unwrap();

    let (diesel_catalog, sqlx_catalog) = (
        catalog(&pool, &by_diesel).await,
        catalog(&pool, &by_sqlx).await,
    );
    outbox_tests::assert_same_catalog(&diesel_catalog, &sqlx_catalog);
    tokio::task::spawn_blocking({
        let url = format!("{}/{by_diesel}", url());
        move || {
            let mut conn = AsyncConnectionWrapper::<AsyncMysqlConnection>::establish(&url)
                .unwrap_or_else(|e| panic!("MariaDB unreachable at {url}: {e}"));
            conn.revert_last_migration(MIGRATIONS).unwrap();
        }
    })
    .await
    .unwrap();
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(table_name AS CHAR) FROM information_schema.tables
         WHERE table_schema = ? AND table_name LIKE 'outbox\\_%'",
    )
    .bind(&by_diesel)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "down.sql left these behind (run scripts/render-migrations.py)"
    );
    for database in [&by_diesel, &by_sqlx] {
        sqlx::query(&format!("DROP DATABASE {database}"))
            .execute(&pool)
            .await
            .unwrap();
    }
}
