//! Claim latency against retained history: 0, 1M and 10M published rows
//! (generated in SQL, published as the store publishes them: behind its
//! cursor) beside 2,000 pending ones. A claim must cost the same
//! whatever the table has kept.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::store::{ClaimRequest, OutboxStore, RelayId, Release};
use outbox_core::{NewEvent, Ordering, PoisonPolicy};
use outbox_sqlx::postgres::PgStore;
use outbox_sqlx::{StoreConfig, TableNames};
use sqlx::{Executor, PgPool};

use super::{Rounds, Scale, progress};
use crate::env::{self, Error};
use crate::report::{Report, TargetCheck};
use crate::stats::Samples;

/// Scenario name.
pub const NAME: &str = "claim-postgres";
const PENDING: usize = 2_000;
const BATCH: usize = 256;

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let sizes: [(&str, i64); 3] = if scale.quick {
        [
            ("retained-0", 0),
            ("retained-10k", 10_000),
            ("retained-100k", 100_000),
        ]
    } else {
        [
            ("retained-0", 0),
            ("retained-1M", 1_000_000),
            ("retained-10M", 10_000_000),
        ]
    };
    let claims_per_round = scale.pick(200, 10);
    let pool = env::pg_pool(4).await?;
    let mut stores = Vec::new();
    for (name, retained) in sizes {
        let started = Instant::now();
        stores.push((name, Arc::new(prepare(&pool, name, retained).await?)));
        progress(format!(
            "{name}: {retained} published + {PENDING} pending rows in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        // Warm the caches the same way for everyone, then alternate one
        // claim per store, so drift within the round hits all alike.
        for (_, store) in &stores {
            claim_and_release(store.as_ref(), 3).await?;
        }
        let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); stores.len()];
        for _ in 0..claims_per_round {
            for (i, (_, store)) in stores.iter().enumerate() {
                latencies[i].extend(claim_and_release(store.as_ref(), 1).await?);
            }
        }
        for ((name, _), values) in stores.iter().zip(latencies) {
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
    pool.close().await;
    Ok(())
}

/// A store in schema `claim_<name>` holding `retained` published rows, then
/// [`PENDING`] events enqueued through the store.
async fn prepare(pool: &PgPool, name: &str, retained: i64) -> Result<PgStore, Error> {
    let schema = format!("claim_{}", name.replace('-', "_").to_lowercase());
    pool.execute(&*format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};"
    ))
    .await?;
    let tables = TableNames::default().in_schema(&schema)?;
    let store = PgStore::new(pool.clone(), StoreConfig::with_tables(tables));
    store.migrate().await?;
    if retained > 0 {
        sqlx::query(&format!(
            "INSERT INTO {schema}.outbox_events (sequence, ord, event_id, aggregate_type, aggregate_id,
                 event_type, partition_key, payload, payload_version, headers, created_at,
                 available_at, status, published_at)
             SELECT g, g, gen_random_uuid(), 'invoice', 'inv-' || g, 'invoice.paid',
                 'sub-' || (g % {keys}), jsonb_build_object('invoice_id', 'inv-' || g, 'amount_cents', g % 9000),
                 1, '{{}}'::jsonb, now(), now(), 0, NULL
             FROM generate_series(1, $1::bigint) AS g",
            keys = env::KEYS
        ))
        .bind(retained)
        .execute(pool)
        .await?;
        sqlx::query(&format!("SELECT setval('{schema}.outbox_events_seq', $1)"))
            .bind(retained)
            .execute(pool)
            .await?;
        // Published the way the store publishes: the cursor has passed them.
        pool.execute(&*format!(
            "UPDATE {schema}.outbox_cursor SET (order_xid, ord, moved_at) =
                 (SELECT order_xid, ord + 1, now() FROM {schema}.outbox_events ORDER BY order_xid DESC, ord DESC LIMIT 1)"
        ))
        .await?;
    }
    let events: Vec<NewEvent> = (0..PENDING).map(|i| env::event(0, i)).collect();
    let mut tx = pool.begin().await?;
    store.enqueue(&mut tx, &events).await?;
    tx.commit().await?;
    pool.execute(&*format!("VACUUM ANALYZE {schema}.outbox_events"))
        .await?;
    Ok(store)
}

/// `count` claims of [`BATCH`] events, each released unstarted right after
/// (so the next claim finds the same backlog); the claim latencies in ms.
async fn claim_and_release(store: &PgStore, count: usize) -> Result<Vec<f64>, Error> {
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
        let started = Instant::now();
        let batch = store.claim_batch(&request).await?;
        latencies.push(started.elapsed().as_secs_f64() * 1_000.0);
        if batch.events.len() != BATCH {
            return Err(format!("claimed {} of {BATCH}", batch.events.len()).into());
        }
        let releases: Vec<Release> = batch
            .events
            .into_iter()
            .map(|e| Release {
                lease: e.lease,
                attempt_started: false,
            })
            .collect();
        store.release(&releases).await?;
    }
    Ok(latencies)
}
