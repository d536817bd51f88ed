//! Shows that the PostgreSQL claim reads forward from its publication
//! cursor, not the retained published rows behind it.
//!
//! `cargo run --example explain-claim [published] [pending]` (defaults
//! 1,000,000 and 1,000). Builds schema `explain_claim` (recreated), fills it
//! in SQL, then prints `EXPLAIN (ANALYZE, BUFFERS)` of the exact claim
//! statement inside a transaction that is rolled back.

use outbox::Ordering;
use outbox::sqlx::postgres::PgStore;
use outbox::sqlx::{StoreConfig, TableNames};
use sqlx::Row;
use sqlx::postgres::PgPoolOptions;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let published: i64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let pending: i64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1_000);
    let url = std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await?;
    sqlx::raw_sql("DROP SCHEMA IF EXISTS explain_claim CASCADE; CREATE SCHEMA explain_claim;")
        .execute(&pool)
        .await?;
    let tables = TableNames::default().in_schema("explain_claim")?;
    let store = PgStore::new(pool.clone(), StoreConfig::with_tables(tables));
    store.migrate().await?;

    let started = std::time::Instant::now();
    let fill = "INSERT INTO explain_claim.outbox_events (sequence, ord, event_id, aggregate_type,
            aggregate_id, event_type, partition_key, payload, payload_version, headers,
            created_at, available_at, status, published_at)
        SELECT g, g, gen_random_uuid(), 'invoice', 'inv-' || g, 'invoice.paid',
            'sub-' || (g % 5000), jsonb_build_object('n', g), 1, '{}'::jsonb,
            now(), now(), 0, NULL
        FROM generate_series($1::bigint, $2::bigint) AS g";
    sqlx::query(fill)
        .bind(1i64)
        .bind(published)
        .execute(&pool)
        .await?;
    // Published the way the store publishes: its cursor has passed them.
    sqlx::query(
        "UPDATE explain_claim.outbox_cursor SET (order_xid, ord) =
             (SELECT order_xid, ord + 1 FROM explain_claim.outbox_events
              ORDER BY order_xid DESC, ord DESC LIMIT 1)",
    )
    .execute(&pool)
    .await?;
    sqlx::query(fill)
        .bind(published + 1)
        .bind(published + pending)
        .execute(&pool)
        .await?;
    sqlx::query(&format!(
        "SELECT setval('explain_claim.outbox_events_seq', {})",
        published + pending
    ))
    .execute(&pool)
    .await?;
    sqlx::query("ANALYZE explain_claim.outbox_events")
        .execute(&pool)
        .await?;
    println!(
        "{published} published + {pending} pending rows loaded in {:?}\n",
        started.elapsed()
    );

    let claim = store.claim_statement(Ordering::PerKey);
    println!("claim statement:\n{claim}\n");
    let mut tx = pool.begin().await?;
    // As the store runs it: after the claim lock, with JIT off.
    sqlx::query("SELECT set_config('jit', 'off', true)")
        .execute(&mut *tx)
        .await?;
    let now = chrono::Utc::now();
    let plan = sqlx::query(&format!("EXPLAIN (ANALYZE, BUFFERS) {claim}"))
        .bind(now)
        .bind("explain-relay")
        .bind(now + chrono::Duration::seconds(30))
        .bind(256i64)
        .bind(5i32)
        .fetch_all(&mut *tx)
        .await?;
    tx.rollback().await?;
    for line in plan {
        println!("{}", line.get::<String, _>(0));
    }
    Ok(())
}
