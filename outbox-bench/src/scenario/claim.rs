//! Claim latency against retained history: 0, 1M and 10M published rows
//! (generated in SQL, published as the store publishes them: ordered by a
//! tick and passed by its cursor) beside 2,000 pending ones. A claim must
//! cost the same whatever the table has kept. Each measured claim is undone
//! in SQL (its lease deleted, the cursor put back), so every claim finds
//! the same backlog in claim order. Beside them, the same backlog beside
//! keys that wait: blocked by a failed row, with events delayed, or
//! backing off after a failed publish (`claim_waiting`); and the claim that sets a hot key's burst aside
//! (`claim_aside`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::store::{ClaimRequest, OutboxStore, RelayId};
use outbox_core::{NewEvent, Ordering, PoisonPolicy};
use outbox_sqlx::postgres::PgStore;
use outbox_sqlx::{StoreConfig, TableNames};
use sqlx::{Executor, PgPool};

use super::{Rounds, Scale, claim_aside, claim_waiting, progress};
use crate::env::{self, Error};
use crate::report::{Report, TargetCheck};
use crate::stats::Samples;

/// Scenario name.
pub const NAME: &str = "claim-postgres";
const PENDING: usize = 2_000;
const BATCH: usize = 256;

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let sizes: [(&str, i64); 6] = if scale.quick {
        [
            ("retained-0", 0),
            ("retained-10k", 10_000),
            ("retained-100k", 100_000),
            (claim_waiting::BLOCKED_NAME, 0),
            (claim_waiting::DELAYED_NAME, 0),
            (claim_waiting::RETRYING_NAME, 0),
        ]
    } else {
        [
            ("retained-0", 0),
            ("retained-1M", 1_000_000),
            ("retained-10M", 10_000_000),
            (claim_waiting::BLOCKED_NAME, 0),
            (claim_waiting::DELAYED_NAME, 0),
            (claim_waiting::RETRYING_NAME, 0),
        ]
    };
    let claims_per_round = scale.pick(200, 10);
    let pool = env::pg_pool(4).await?;
    let mut stores = Vec::new();
    for (name, retained) in sizes {
        let started = Instant::now();
        let (store, schema) = prepare(&pool, name, retained).await?;
        stores.push((name, Arc::new(store), schema));
        progress(format!(
            "{name}: {retained} published + {PENDING} pending rows in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }
    let aside = claim_aside::prepare(&pool).await?;
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        // Warm the caches the same way for everyone, then alternate one
        // claim per store, so drift within the round hits all alike.
        for (_, store, schema) in &stores {
            claim_and_undo(store.as_ref(), &pool, schema, 3).await?;
        }
        claim_aside::claim_and_undo(&aside, &pool, 3).await?;
        let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); stores.len()];
        let mut aside_latencies = Vec::new();
        for _ in 0..claims_per_round {
            for (i, (_, store, schema)) in stores.iter().enumerate() {
                latencies[i].extend(claim_and_undo(store.as_ref(), &pool, schema, 1).await?);
            }
            aside_latencies.extend(claim_aside::claim_and_undo(&aside, &pool, 1).await?);
        }
        let samples = Samples(aside_latencies);
        rounds.add(claim_aside::NAME, "claim p50 ms", samples.median(), false);
        progress(format!(
            "round {round} {}: claim p50 {:.3} ms",
            claim_aside::NAME,
            samples.median()
        ));
        for ((name, _, _), values) in stores.iter().zip(latencies) {
            let samples = Samples(values);
            rounds.add(name, "claim p50 ms", samples.median(), false);
            progress(format!(
                "round {round} {name}: claim p50 {:.3} ms",
                samples.median()
            ));
        }
    }
    rounds.finish(NAME, report);
    let m = |report: &Report, c: &str| report.median(NAME, c, "claim p50 ms").unwrap_or(f64::NAN);
    let ratio = m(report, sizes[2].0) / m(report, sizes[0].0);
    report.target(TargetCheck::at_most(
        format!("claim: {} / retained-0 latency", sizes[2].0),
        ratio,
        1.2,
    ));
    for waiting in claim_waiting::NAMES {
        report.target(TargetCheck::at_most(
            format!("claim: {waiting} / retained-0 latency"),
            m(report, waiting) / m(report, sizes[0].0),
            1.2,
        ));
    }
    pool.close().await;
    Ok(())
}

/// A store in schema `claim_<name>` holding `retained` published rows, then
/// [`PENDING`] events enqueued through the store.
async fn prepare(pool: &PgPool, name: &str, retained: i64) -> Result<(PgStore, String), Error> {
    let schema = format!("claim_{}", name.replace('-', "_").to_lowercase());
    pool.execute(&*format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
    ))
    .await?;
    let tables = TableNames::default().in_schema(&schema)?;
    let store = PgStore::new(pool.clone(), StoreConfig::with_tables(tables));
    store.migrate().await?;
    // The control and cursor rows are written by the first tick (a claim's),
    // not by migrate(): write them now so the cursor can be read and put back.
    pool.execute(&*format!("SELECT {schema}.outbox_tick()"))
        .await?;
    claim_waiting::prepare(&store, &schema, name).await?;
    if retained > 0 {
        sqlx::query(&format!(
            "INSERT INTO {schema}.outbox_events (event_id, aggregate_type, aggregate_id,
                 event_type, partition_key, payload)
             SELECT gen_random_uuid(), 'invoice', 'inv-' || g, 'invoice.paid',
                 'sub-' || (g % {keys}), jsonb_build_object('invoice_id', 'inv-' || g, 'amount_cents', g % 9000)
             FROM generate_series(1, $1::bigint) AS g",
            keys = env::KEYS
        ))
        .bind(retained)
        .execute(pool)
        .await?;
        // Published the way the store publishes: a tick ordered them and the
        // cursor passed them (no row written after its insert).
        pool.execute(&*format!(
            "SELECT {schema}.outbox_tick();
             SELECT {schema}.outbox_cursor_write(end_position, end_position, tick_snapshot,
                 system_identifier, now(), rebased_at, live_from, kept_from)
                 FROM {schema}.outbox_cursor_now;"
        ))
        .await?;
    }
    let events: Vec<NewEvent> = (0..PENDING).map(|i| env::event(0, i)).collect();
    let mut tx = pool.begin().await?;
    store.enqueue(&mut tx, &events).await?;
    tx.commit().await?;
    pool.execute(&*format!("VACUUM ANALYZE {schema}.outbox_events"))
        .await?;
    Ok((store, schema))
}

/// `count` claims of [`BATCH`] events, each undone right after (its lease
/// deleted, the cursor put back: the next claim finds the same backlog);
/// the claim latencies in ms.
async fn claim_and_undo(
    store: &PgStore,
    pool: &PgPool,
    schema: &str,
    count: usize,
) -> Result<Vec<f64>, Error> {
    let request = ClaimRequest {
        owner: RelayId::new("bench-claim"),
        limit: BATCH,
        lease_duration: Duration::from_secs(30),
        ordering: Ordering::PerKey,
        poison: PoisonPolicy::Skip,
        crash_loop_limit: 5,
    };
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let position: i64 =
            sqlx::query_scalar(&format!("SELECT position FROM {schema}.outbox_cursor_now"))
                .fetch_one(pool)
                .await?;
        let started = Instant::now();
        let batch = store.claim_batch(&request).await?;
        latencies.push(started.elapsed().as_secs_f64() * 1_000.0);
        if batch.events.len() != BATCH {
            return Err(format!("claimed {} of {BATCH}", batch.events.len()).into());
        }
        sqlx::query(&format!("DELETE FROM {schema}.outbox_leases"))
            .execute(pool)
            .await?;
        put_cursor_back(pool, schema, position).await?;
    }
    Ok(latencies)
}

/// Writes the cursor of the store in `schema` back to `position` (a claim
/// moved it), keeping the rest of the cursor row as it is.
pub(super) async fn put_cursor_back(
    pool: &PgPool,
    schema: &str,
    position: i64,
) -> Result<(), Error> {
    sqlx::query(&format!(
        "SELECT {schema}.outbox_cursor_write($1, end_position, tick_snapshot,
             system_identifier, moved_at, rebased_at, live_from, kept_from)
             FROM {schema}.outbox_cursor_now"
    ))
    .bind(position)
    .execute(pool)
    .await?;
    Ok(())
}
