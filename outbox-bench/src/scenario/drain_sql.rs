//! The drain on MariaDB and SQLite: one relay (per-key and unordered,
//! batch 1,000, 10,000 keys, no-op publisher), the seed's relay on MariaDB
//! as its baselines, and what one troubled key costs every other key:
//!
//! * `parked-key`: a key whose head failed under `PoisonPolicy::Block`,
//!   with [`OBSTACLE_BACKLOG`] events parked behind it;
//! * `head-in-flight`: a key whose head another relay holds leased (and
//!   will not settle during the drain), [`OBSTACLE_BACKLOG`] events behind;
//! * `delayed-keys`: [`OBSTACLE_BACKLOG`] events scheduled an hour later,
//!   each on its own key (reminders, say);
//! * `blocked-keys`: 10,000 keys (500 with `--quick`) whose head failed under
//!   `PoisonPolicy::Block`, an event parked behind each (what a week of
//!   unattended failures leaves);
//! * `backoff-keys`: as many keys whose head backs off an hour
//!   after a failed publish, an event behind each (a destination down).
//!
//! Either key's events stay open; every other event must be delivered at
//! the clean backlog's rate.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::store::{FailReason, Nack, NackAction, OutboxAdmin, OutboxStore};
use outbox_core::{ErrorClass, NewEvent, Ordering, OutboxWriter, PoisonPolicy, RelayConfig};

use super::{Rounds, Scale, progress, rate};
use crate::counting::CountingPublisher;
use crate::env::{self, Error, FILL_CHUNK};
use crate::relay_run;
use crate::report::{Report, TargetCheck};
use crate::seed::Baseline;
use crate::seed_mysql;

/// Events per claim, as on PostgreSQL's drain.
const BATCH: usize = 1_000;
/// Events behind the troubled key's head.
const OBSTACLE_BACKLOG: usize = 2_000;

/// A troubled key beside the backlog, or none.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Obstacle {
    None,
    ParkedKey,
    HeadInFlight,
    DelayedKeys,
    BlockedKeys,
    BackoffKeys,
}

const RELAY_CONTENDERS: [(&str, Ordering, Obstacle); 7] = [
    ("relay-per-key", Ordering::PerKey, Obstacle::None),
    ("relay-unordered", Ordering::Unordered, Obstacle::None),
    (
        "relay-per-key-parked-key",
        Ordering::PerKey,
        Obstacle::ParkedKey,
    ),
    (
        "relay-per-key-head-in-flight",
        Ordering::PerKey,
        Obstacle::HeadInFlight,
    ),
    (
        "relay-per-key-delayed-keys",
        Ordering::PerKey,
        Obstacle::DelayedKeys,
    ),
    (
        "relay-per-key-blocked-keys",
        Ordering::PerKey,
        Obstacle::BlockedKeys,
    ),
    (
        "relay-per-key-backoff-keys",
        Ordering::PerKey,
        Obstacle::BackoffKeys,
    ),
];

const SEED_CONTENDERS: [(&str, Baseline, usize); 4] = [
    ("seed-per-row-1w", Baseline::PerRow, 1),
    ("seed-per-row-4w", Baseline::PerRow, 4),
    ("seed-batched-1w", Baseline::Batched, 1),
    ("seed-batched-4w", Baseline::Batched, 4),
];

/// Scenario name per dialect.
pub fn name(dialect: &str) -> String {
    format!("drain-{dialect}")
}

/// Runs the scenario on `dialects` (`mariadb`, `sqlite`) and checks its
/// targets.
pub async fn run(scale: Scale, dialects: &[&str], report: &mut Report) -> Result<(), Error> {
    for &dialect in dialects {
        let n = scale.pick(50_000, 2_000);
        // Keys that wait in `blocked-keys` and `backoff-keys`, two events
        // each: what a week of unattended failures can leave.
        let waiting_keys = scale.pick(10_000, 500);
        let mut rounds = Rounds::default();
        for round in 0..scale.rounds {
            // Every other round runs the contenders in reverse, so a
            // server warming up (or cooling down) over a round favours
            // none of them in the medians.
            let mut contenders = RELAY_CONTENDERS.to_vec();
            if round % 2 == 1 {
                contenders.reverse();
            }
            for (contender, ordering, obstacle) in contenders {
                if !scale.includes(contender) {
                    continue;
                }
                let sizes = Sizes { n, waiting_keys };
                let elapsed = relay(dialect, ordering, obstacle, round, sizes).await?;
                record(&mut rounds, round, dialect, contender, n, elapsed);
            }
            if dialect != "mariadb" {
                continue;
            }
            for (contender, baseline, workers) in SEED_CONTENDERS {
                if !scale.includes(contender) {
                    continue;
                }
                let elapsed = seed(baseline, workers, n).await?;
                record(&mut rounds, round, dialect, contender, n, elapsed);
            }
        }
        let scenario = name(dialect);
        rounds.finish(&scenario, report);
        check(report, &scenario);
    }
    Ok(())
}

fn record(
    rounds: &mut Rounds,
    round: usize,
    dialect: &str,
    contender: &str,
    n: usize,
    elapsed: Duration,
) {
    crate::query_count::print_profile(&format!("{dialect} {contender} round {round}"));
    let events_per_second = rate(n as u64, elapsed);
    rounds.add(contender, "events/s", events_per_second, true);
    progress(format!(
        "round {round} {dialect} {contender}: {events_per_second:.0} events/s"
    ));
}

fn check(report: &mut Report, scenario: &str) {
    let m = |report: &Report, c: &str| report.median(scenario, c, "events/s");
    let Some(per_key) = m(report, "relay-per-key") else {
        return;
    };
    if let Some(unordered) = m(report, "relay-unordered") {
        report.target(TargetCheck::reported(
            format!("{scenario}: relay-per-key / relay-unordered"),
            per_key / unordered,
        ));
    }
    for obstacle in [
        "relay-per-key-parked-key",
        "relay-per-key-head-in-flight",
        "relay-per-key-delayed-keys",
        "relay-per-key-blocked-keys",
        "relay-per-key-backoff-keys",
    ] {
        if let Some(troubled) = m(report, obstacle) {
            report.target(TargetCheck::at_most(
                format!("{scenario}: cost of {obstacle} (clean / troubled)"),
                per_key / troubled,
                1.2,
            ));
        }
    }
    if let Some(seed) = m(report, "seed-batched-4w") {
        report.target(TargetCheck::at_least(
            format!("{scenario}: relay-per-key / seed-batched-4w"),
            per_key / seed,
            1.0,
        ));
    }
    if let Some(seed) = m(report, "seed-per-row-1w") {
        report.target(TargetCheck::reported(
            format!("{scenario}: relay-per-key / seed-per-row-1w"),
            per_key / seed,
        ));
    }
}

/// A round's backlog (`n` events) and the keys that wait beside it.
#[derive(Clone, Copy)]
struct Sizes {
    n: usize,
    waiting_keys: usize,
}

/// One relay contender's drain on `dialect`.
async fn relay(
    dialect: &str,
    ordering: Ordering,
    obstacle: Obstacle,
    round: usize,
    sizes: Sizes,
) -> Result<Duration, Error> {
    let n = sizes.n;
    let config = RelayConfig {
        poison: match obstacle {
            Obstacle::ParkedKey | Obstacle::BlockedKeys => PoisonPolicy::Block,
            _ => PoisonPolicy::Skip,
        },
        ..relay_run::config(BATCH, ordering)
    };
    let publisher = Arc::new(CountingPublisher::noop(BATCH));
    if dialect == "mariadb" {
        let store = Arc::new(env::mysql_store(8).await?);
        env::mysql_reset(&store).await?;
        let left_open = prepare(store.as_ref(), obstacle, round, sizes).await?;
        let elapsed =
            relay_run::drain_leaving(store.clone(), publisher, config, n as u64, left_open).await;
        store.pool().close().await;
        elapsed
    } else {
        let store = Arc::new(env::sqlite_store(std::path::Path::new("target/bench/sqlite")).await?);
        let left_open = prepare(store.as_ref(), obstacle, round, sizes).await?;
        let elapsed =
            relay_run::drain_leaving(store.clone(), publisher, config, n as u64, left_open).await;
        store.pool().close().await;
        elapsed
    }
}

/// Sets up the obstacle (its key's events first, its head claimed and
/// failed or held), then enqueues the `n` events of the backlog. Returns
/// how many events the drain must leave open.
async fn prepare<S>(
    store: &S,
    obstacle: Obstacle,
    round: usize,
    sizes: Sizes,
) -> Result<usize, Error>
where
    S: OutboxStore + OutboxAdmin + OutboxWriter,
{
    let n = sizes.n;
    let left_open = if obstacle == Obstacle::None {
        0
    } else if obstacle == Obstacle::DelayedKeys {
        let later = chrono::Utc::now() + chrono::Duration::hours(1);
        let events: Vec<NewEvent> = (0..OBSTACLE_BACKLOG)
            .map(|i| {
                let mut event = env::event_for_key(round, n + i, usize::MAX - i);
                event.available_at = Some(later);
                event
            })
            .collect();
        store.enqueue(&events).await?;
        OBSTACLE_BACKLOG
    } else if matches!(obstacle, Obstacle::BlockedKeys | Obstacle::BackoffKeys) {
        let keys = sizes.waiting_keys;
        let events: Vec<NewEvent> = (0..2 * keys)
            .map(|i| env::event_for_key(round, n + i, usize::MAX - i % keys))
            .collect();
        wait_keys(store, &events, keys, obstacle == Obstacle::BlockedKeys).await?;
        events.len()
    } else {
        let troubled_key = usize::MAX - round;
        let events: Vec<NewEvent> = (0..OBSTACLE_BACKLOG)
            .map(|i| env::event_for_key(round, n + i, troubled_key))
            .collect();
        store.enqueue(&events).await?;
        let claimed = env::claim_heads(store, 1).await?;
        let [head] = claimed.as_slice() else {
            return Err(format!("claimed {} troubled heads", claimed.len()).into());
        };
        if obstacle == Obstacle::ParkedKey {
            store
                .nack(&[Nack {
                    lease: head.lease.clone(),
                    action: NackAction::Fail {
                        reason: FailReason::Permanent,
                        block_key: true,
                    },
                    error_class: ErrorClass::Permanent,
                    error: "bench: the key's head cannot be published".into(),
                }])
                .await?;
        }
        OBSTACLE_BACKLOG
    };
    for start in (0..n).step_by(FILL_CHUNK) {
        let events: Vec<NewEvent> = (start..(start + FILL_CHUNK).min(n))
            .map(|i| env::event(round, i))
            .collect();
        store.enqueue(&events).await?;
    }
    Ok(left_open)
}

/// Enqueues `events` (two on each of `keys` keys), claims every key's head
/// and fails it blocking its key (`block`) or retries it an hour later, so
/// the event behind it waits; then one claim meets them.
async fn wait_keys<S>(store: &S, events: &[NewEvent], keys: usize, block: bool) -> Result<(), Error>
where
    S: OutboxStore + OutboxWriter,
{
    for chunk in events.chunks(FILL_CHUNK) {
        store.enqueue(chunk).await?;
    }
    // Each claim takes heads of keys not yet in flight; the events behind
    // them wait for their key.
    let heads = env::claim_heads(store, keys).await?;
    if block {
        env::block_all(store, &heads).await?;
    } else {
        env::back_off_all(store, &heads).await?;
    }
    // A week's claims have met the rows behind these keys long ago: one
    // claim meets them here, untimed (its time is printed: what setting
    // them aside costs, once).
    let met = env::meet_waiting(store).await?;
    progress(format!(
        "a claim meeting {keys} waiting keys' rows: {:.1} ms",
        met.as_secs_f64() * 1e3
    ));
    Ok(())
}

/// One seed contender's drain on MariaDB.
async fn seed(baseline: Baseline, workers: usize, n: usize) -> Result<Duration, Error> {
    let store = env::mysql_store(workers as u32 + 1).await?;
    let pool = store.pool().clone();
    seed_mysql::fill(&pool, n).await?;
    let publisher = Arc::new(CountingPublisher::noop(1));
    let started = std::time::Instant::now();
    seed_mysql::drain(&pool, baseline, workers, publisher.clone()).await?;
    let elapsed = started.elapsed();
    let left = seed_mysql::pending(&pool).await?;
    pool.close().await;
    if left != 0 || publisher.delivered() < n as u64 {
        return Err(format!(
            "seed on MariaDB: {left} rows left, {} delivered",
            publisher.delivered()
        )
        .into());
    }
    Ok(elapsed)
}
