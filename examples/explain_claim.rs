//! Shows that a PostgreSQL claim costs the same whatever history lies
//! behind the cursor: the claim reads forward from its cursor in claim
//! order, never the retained published rows.
//!
//! `cargo run --example explain-claim [published] [pending]` (defaults
//! 1,000,000 and 1,000). Builds schema `explain_claim` (recreated), fills it
//! in SQL (the published rows ordered by a tick and passed by the cursor, as
//! the relay leaves them), then prints `EXPLAIN (ANALYZE, BUFFERS)` of the
//! exact claim call (its buffers include every statement inside the claim
//! function) inside a transaction that is rolled back, and the claim's time
//! over 20 such runs.

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
    let fill = "INSERT INTO explain_claim.outbox_events (event_id, aggregate_type, aggregate_id,
            event_type, partition_key, payload)
        SELECT gen_random_uuid(), 'invoice', 'inv-' || g, 'invoice.paid', 'sub-' || (g % 5000),
            jsonb_build_object('n', g)
        FROM generate_series(1, $1::bigint) AS g";
    sqlx::query(fill).bind(published).execute(&pool).await?;
    // Ordered by a tick and passed by the cursor: published, as a relay
    // leaves them (no row written after its insert).
    sqlx::query("SELECT explain_claim.outbox_tick()")
        .execute(&pool)
        .await?;
    sqlx::query(
        "SELECT explain_claim.outbox_cursor_write(end_position, end_position, tick_snapshot,
             system_identifier, now(), rebased_at, live_from, kept_from)
             FROM explain_claim.outbox_cursor_now",
    )
    .execute(&pool)
    .await?;
    sqlx::query(fill).bind(pending).execute(&pool).await?;
    sqlx::query("ANALYZE explain_claim.outbox_events")
        .execute(&pool)
        .await?;
    println!(
        "{published} published + {pending} pending rows loaded in {:?}\n",
        started.elapsed()
    );

    let claim = store.claim_statement();
    println!("claim statement: {claim}\n");
    let mut tx = pool.begin().await?;
    let explain = format!("EXPLAIN (ANALYZE, BUFFERS) {claim}");
    let plan = bind_claim(sqlx::query(&explain))
        .fetch_all(&mut *tx)
        .await?;
    tx.rollback().await?;
    for line in plan {
        println!("{}", line.get::<String, _>(0));
    }
    let mut times = Vec::new();
    for _ in 0..20 {
        let mut tx = pool.begin().await?;
        let started = std::time::Instant::now();
        let claimed = bind_claim(sqlx::query(claim)).fetch_all(&mut *tx).await?;
        times.push(started.elapsed());
        tx.rollback().await?;
        assert_eq!(claimed.len(), 256.min(pending as usize));
    }
    times.sort();
    println!(
        "\nclaim of 256 over {published} published rows: median {:?}, max {:?}",
        times[times.len() / 2],
        times[times.len() - 1]
    );
    Ok(())
}

/// The claim's parameters (`PgStore::claim_statement`): owner, limit,
/// lease in milliseconds, crash-loop limit, per-key order, block on poison.
fn bind_claim(
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind("explain-relay")
        .bind(256i32)
        .bind(30_000i64)
        .bind(5i32)
        .bind(true)
        .bind(false)
}
