//! Diesel's embedded migration builds exactly the tables, indexes, triggers
//! and functions the sqlx store's `migrate` builds: the two catalogs are
//! compared on live PostgreSQL. Reverting it (down.sql, generated from
//! up.sql by `scripts/render-migrations.py`) leaves nothing.

use diesel::Connection;
use diesel::connection::SimpleConnection;
use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_migrations::MigrationHarness;
use outbox_core::EventId;
use outbox_diesel::postgres::MIGRATIONS;
use outbox_sqlx::postgres::PgStore;
use sqlx::Row;

fn url() -> String {
    std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".into())
}

fn fresh_schema(stem: &str) -> String {
    format!(
        "{stem}_{}",
        &EventId::random().as_uuid().simple().to_string()[..12]
    )
}

/// One catalog, with the schema's name taken out of every definition.
async fn catalog(pool: &sqlx::PgPool, schema: &str) -> Vec<String> {
    let queries = [
        "SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' '
                || is_nullable || ' ' || coalesce(column_default, '')
         FROM information_schema.columns
         WHERE table_schema = $1 AND table_name LIKE 'outbox\\_%'",
        "SELECT 'index ' || tablename || ' ' || indexdef FROM pg_indexes
         WHERE schemaname = $1 AND tablename LIKE 'outbox\\_%'",
        "SELECT 'trigger ' || event_object_table || ' ' || trigger_name || ' '
                || event_manipulation || ' ' || action_timing || ' ' || action_statement
         FROM information_schema.triggers WHERE trigger_schema = $1",
        "SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid)
                || ') ' || pg_get_function_result(p.oid)
         FROM pg_proc p WHERE p.pronamespace = $1::regnamespace",
        "SELECT 'sequence ' || sequence_name || ' ' || data_type
         FROM information_schema.sequences WHERE sequence_schema = $1",
    ];
    let mut entries = Vec::new();
    for query in queries {
        for row in sqlx::query(query)
            .bind(schema)
            .fetch_all(pool)
            .await
            .unwrap()
        {
            let entry: String = row.get(0);
            entries.push(entry.replace(&format!("{schema}."), ""));
        }
    }
    entries.sort();
    entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diesel_migrations_and_the_sqlx_migrate_build_the_same_catalog() {
    let (by_diesel, by_sqlx) = (fresh_schema("dmig"), fresh_schema("smig"));
    tokio::task::spawn_blocking({
        let schema = by_diesel.clone();
        move || {
            let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::establish(&url())
                .unwrap_or_else(|e| panic!("PostgreSQL unreachable at {}: {e}", url()));
            conn.batch_execute(&format!(
                "CREATE SCHEMA {schema}; SET search_path TO {schema}"
            ))
            .unwrap();
            let applied = conn.run_pending_migrations(MIGRATIONS).unwrap();
            assert_eq!(applied.len(), 1, "one migration");
        }
    })
    .await
    .unwrap();

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url())
        .await
        .unwrap();
    sqlx::query(&format!("CREATE SCHEMA {by_sqlx}"))
        .execute(&pool)
        .await
        .unwrap();
    PgStore::new(
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
        let schema = by_diesel.clone();
        move || {
            let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::establish(&url())
                .unwrap_or_else(|e| panic!("PostgreSQL unreachable at {}: {e}", url()));
            conn.batch_execute(&format!("SET search_path TO {schema}"))
                .unwrap();
            conn.revert_last_migration(MIGRATIONS).unwrap();
        }
    })
    .await
    .unwrap();
    assert_eq!(
        catalog(&pool, &by_diesel).await,
        Vec::<String>::new(),
        "down.sql left these behind (run scripts/render-migrations.py)"
    );
    for schema in [&by_diesel, &by_sqlx] {
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&pool)
            .await
            .unwrap();
    }
}
