//! The relay against PgQ's one consumer, the fastest queue in PostgreSQL
//! (see [`crate::pgq`] for what each does per event and per batch): the
//! same 100,000 events (1,000 keys, about 120 bytes of JSON each) committed
//! in transactions of 1,000 into each, then drained to a no-op publisher in
//! batches of 1,000, contenders interleaved round by round.

use std::sync::Arc;

use outbox_core::Ordering;

use super::{Rounds, Scale, progress, rate};
use crate::counting::CountingPublisher;
use crate::env::{self, Error};
use crate::report::{Report, TargetCheck};
use crate::{fleet, pgq, relay_run};

/// Scenario name in the table and JSON.
pub const NAME: &str = "pgq-postgres";
/// Events per producer transaction, per PgQ tick and per relay claim.
const BATCH: usize = 1_000;
/// Keys of the backlog (one contender puts every event on one key).
const KEYS: usize = 1_000;

/// PgQ's one consumer: every ratio's denominator.
const PGQ: &str = "pgq-1-consumer";

/// The relay contenders: name, relay processes (0: one relay in this
/// process), ordering, keys.
const RELAYS: [(&str, usize, Ordering, usize); 4] = [
    ("relay-per-key-1k-keys", 0, Ordering::PerKey, KEYS),
    ("relay-per-key-1-key", 0, Ordering::PerKey, 1),
    ("relay-unordered-1k-keys", 0, Ordering::Unordered, KEYS),
    ("relays-4-processes-1k-keys", 4, Ordering::PerKey, KEYS),
];

/// Runs the scenario and checks its targets.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let n = scale.pick(100_000, 4_000);
    let pool = env::pg_pool(8).await?;
    pgq::install(&pool).await?;
    let store = Arc::new(env::pg_store(&pool).await?);
    let log_dir = std::env::temp_dir().join(format!("outbox-bench-pgq-{}", std::process::id()));
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        if scale.includes(PGQ) {
            pgq::reset(&pool, BATCH).await?;
            pgq::fill(&pool, n, BATCH, |i| env::event_for_key(round, i, i % KEYS)).await?;
            let publisher = Arc::new(CountingPublisher::noop(BATCH));
            let elapsed = pgq::drain(&pool, publisher.clone(), n as u64).await?;
            if publisher.delivered() != n as u64 {
                return Err(format!("{PGQ}: {} of {n} delivered", publisher.delivered()).into());
            }
            record(&mut rounds, round, PGQ, n, elapsed);
        }
        for (name, processes, ordering, keys) in RELAYS {
            if !scale.includes(name) {
                continue;
            }
            env::pg_reset(&pool).await?;
            env::pg_fill_in(&store, n, BATCH, |i| env::event_for_key(round, i, i % keys)).await?;
            let elapsed = if processes == 0 {
                let publisher = Arc::new(CountingPublisher::noop(BATCH));
                let config = relay_run::config(BATCH, ordering);
                relay_run::drain(store.clone(), publisher, config, 1, n as u64).await?
            } else {
                let elapsed = fleet::drain(processes, BATCH, ordering, n as u64, &log_dir).await?;
                env::check_drained(store.as_ref(), n).await?;
                elapsed
            };
            record(&mut rounds, round, name, n, elapsed);
        }
    }
    let _ = std::fs::remove_dir_all(&log_dir);
    rounds.finish(NAME, report);
    let m = |report: &Report, c: &str| report.median(NAME, c, "events/s").unwrap_or(f64::NAN);
    let pgq = m(report, PGQ);
    for (contender, bound) in [
        ("relay-per-key-1k-keys", Some(1.0)),
        ("relay-per-key-1-key", Some(0.8)),
        ("relay-unordered-1k-keys", None),
        ("relays-4-processes-1k-keys", Some(1.5)),
    ] {
        let label = format!("pgq: {contender} / {PGQ}");
        let ratio = m(report, contender) / pgq;
        report.target(match bound {
            Some(bound) => TargetCheck::at_least(label, ratio, bound),
            None => TargetCheck::reported(label, ratio),
        });
    }
    pool.close().await;
    Ok(())
}

fn record(rounds: &mut Rounds, round: usize, name: &str, n: usize, elapsed: std::time::Duration) {
    let events_per_second = rate(n as u64, elapsed);
    rounds.add(name, "events/s", events_per_second, true);
    progress(format!(
        "round {round} {name}: {events_per_second:.0} events/s"
    ));
}
