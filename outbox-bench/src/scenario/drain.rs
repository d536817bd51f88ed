//! Drain 200k pre-inserted events to a no-op publisher on PostgreSQL: the
//! relay (per-key and unordered), and 1, 2 and 4 relays in processes of
//! their own (per-key order checked across them), against the seed's relay
//! and the floor.

use std::sync::Arc;

use outbox_core::Ordering;

use super::{Rounds, Scale, progress, rate};
use crate::counting::CountingPublisher;
use crate::env::{self, Error};
use crate::report::{Report, TargetCheck};
use crate::seed::{self, Baseline};
use crate::{fleet, relay_run};

/// Scenario name in the table and JSON.
pub const NAME: &str = "drain-postgres";
/// Events per claim for the relay contenders (the floor marks 1,000 per statement).
pub const RELAY_BATCH: usize = 1_000;

/// Relays in separate OS processes (per-key order, checked across them).
const FLEETS: [(&str, usize); 3] = [
    ("relays-1-process", 1),
    ("relays-2-processes", 2),
    ("relays-4-processes", 4),
];

const SEED_CONTENDERS: [(&str, Baseline, usize); 4] = [
    ("seed-per-row-1w", Baseline::PerRow, 1),
    ("seed-per-row-4w", Baseline::PerRow, 4),
    ("seed-batched-1w", Baseline::Batched, 1),
    ("seed-batched-4w", Baseline::Batched, 4),
];

/// Runs the scenario and checks its targets.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let n = scale.pick(200_000, 10_000);
    let pool = env::pg_pool(8).await?;
    let store = Arc::new(env::pg_store(&pool).await?);
    let log_dir = std::env::temp_dir().join(format!("outbox-bench-fleet-{}", std::process::id()));
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        for (name, ordering) in [
            ("relay-per-key", Ordering::PerKey),
            ("relay-unordered", Ordering::Unordered),
        ] {
            if !scale.includes(name) {
                continue;
            }
            env::pg_reset(&pool).await?;
            env::pg_fill(&store, round, n).await?;
            let publisher = Arc::new(CountingPublisher::noop(RELAY_BATCH));
            let config = relay_run::config(RELAY_BATCH, ordering);
            let wal = env::pg_wal_position(&pool).await?;
            let elapsed =
                relay_run::drain(store.clone(), publisher, config, scale.relays, n as u64).await?;
            let wal_bytes = env::pg_wal_bytes_since(&pool, &wal).await?;
            record(&mut rounds, round, name, n, elapsed, wal_bytes);
        }
        for (name, relays) in FLEETS {
            if !scale.includes(name) {
                continue;
            }
            env::pg_reset(&pool).await?;
            env::pg_fill(&store, round, n).await?;
            let wal = env::pg_wal_position(&pool).await?;
            let elapsed =
                fleet::drain(relays, RELAY_BATCH, Ordering::PerKey, n as u64, &log_dir).await?;
            env::check_drained(store.as_ref(), n).await?;
            let wal_bytes = env::pg_wal_bytes_since(&pool, &wal).await?;
            record(&mut rounds, round, name, n, elapsed, wal_bytes);
        }
        for (name, baseline, workers) in SEED_CONTENDERS {
            if !scale.includes(name) {
                continue;
            }
            seed::fill(&pool, n).await?;
            let publisher = Arc::new(CountingPublisher::noop(1));
            let wal = env::pg_wal_position(&pool).await?;
            let started = std::time::Instant::now();
            seed::drain(&pool, baseline, workers, publisher.clone()).await?;
            let elapsed = started.elapsed();
            let left = seed::pending(&pool).await?;
            if left != 0 || publisher.delivered() < n as u64 {
                return Err(format!(
                    "{name}: {left} rows left, {} delivered",
                    publisher.delivered()
                )
                .into());
            }
            let wal_bytes = env::pg_wal_bytes_since(&pool, &wal).await?;
            record(&mut rounds, round, name, n, elapsed, wal_bytes);
        }
        if !scale.includes("raw-floor") {
            continue;
        }
        seed::fill(&pool, n).await?;
        let wal = env::pg_wal_position(&pool).await?;
        let started = std::time::Instant::now();
        let marked = seed::raw_floor(&pool).await?;
        let elapsed = started.elapsed();
        if marked != n as u64 {
            return Err(format!("raw-floor marked {marked} of {n}").into());
        }
        let wal_bytes = env::pg_wal_bytes_since(&pool, &wal).await?;
        record(&mut rounds, round, "raw-floor", n, elapsed, wal_bytes);
    }
    let _ = std::fs::remove_dir_all(&log_dir);
    rounds.finish(NAME, report);
    let m = |report: &Report, c: &str| report.median(NAME, c, "events/s").unwrap_or(f64::NAN);
    let per_key = m(report, "relay-per-key");
    for (baseline, bound) in [("raw-floor", 0.7), ("relay-unordered", 0.7)] {
        let ratio = per_key / m(report, baseline);
        report.target(TargetCheck::at_least(
            format!("drain: relay-per-key / {baseline}"),
            ratio,
            bound,
        ));
    }
    for baseline in ["seed-batched-4w", "seed-per-row-1w"] {
        report.target(TargetCheck::reported(
            format!("drain: relay-per-key / {baseline}"),
            per_key / m(report, baseline),
        ));
    }
    let four = m(report, "relays-4-processes");
    for (baseline, bound) in [
        ("relays-1-process", 1.0),
        ("seed-batched-4w", 1.5),
        ("seed-per-row-1w", 10.0),
    ] {
        report.target(TargetCheck::at_least(
            format!("drain: relays-4-processes / {baseline}"),
            four / m(report, baseline),
            bound,
        ));
    }
    pool.close().await;
    Ok(())
}

/// One contender's round: throughput and the WAL it wrote per event.
fn record(
    rounds: &mut Rounds,
    round: usize,
    name: &str,
    n: usize,
    elapsed: std::time::Duration,
    wal_bytes: f64,
) {
    let events_per_second = rate(n as u64, elapsed);
    rounds.add(name, "events/s", events_per_second, true);
    rounds.add(name, "WAL bytes/event", wal_bytes / n as f64, false);
    progress(format!(
        "round {round} {name}: {events_per_second:.0} events/s"
    ));
}
