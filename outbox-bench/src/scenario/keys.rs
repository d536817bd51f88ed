//! Ordered drains at every key shape: one relay, default settings, per-key
//! order, over backlogs on 1, 10, 1,000, 10,000 and 100,000 keys and a
//! Zipf-distributed key set, beside the unordered drain of the same store.
//!
//! A backlog on a few keys (a bulk import for one customer, one hot
//! aggregate) is where an ordered relay can stall: every key with pending
//! events is leased by the batch in flight, so the claim made meanwhile
//! finds nothing. The ratios to the unordered drain say whether it does.

use std::sync::Arc;

use outbox_core::policy::{RandomSource, SplitMix64};
use outbox_core::{Ordering, RelayConfig};

use super::{Rounds, Scale, progress, rate};
use crate::counting::CountingPublisher;
use crate::env::{self, Error};
use crate::report::{Report, TargetCheck};
use crate::{query_count, relay_run};

/// How a backlog's events spread over keys.
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    /// Round-robin over this many keys.
    Keys(usize),
    /// Zipf (exponent 1) over [`ZIPF_KEYS`] keys: key 0 takes about a
    /// tenth of the events, most keys a handful.
    Zipf,
}

const ZIPF_KEYS: usize = 10_000;

/// The key shapes a backlog is measured on, by name; the `brokers`
/// scenario drains the same ones.
pub const SHAPES: [(&str, Shape); 6] = [
    ("1-key", Shape::Keys(1)),
    ("10-keys", Shape::Keys(10)),
    ("1k-keys", Shape::Keys(1_000)),
    ("10k-keys", Shape::Keys(10_000)),
    ("100k-keys", Shape::Keys(100_000)),
    ("zipf-10k", Shape::Zipf),
];

/// The unordered drain the per-key ones are measured against.
const UNORDERED: &str = "unordered-1k-keys";

/// The unordered drain, then a per-key drain (`per-key-{shape}`) per shape.
fn contenders() -> Vec<(String, Ordering, Shape)> {
    let per_key = SHAPES
        .iter()
        .map(|&(name, shape)| (format!("per-key-{name}"), Ordering::PerKey, shape));
    std::iter::once((
        UNORDERED.to_string(),
        Ordering::Unordered,
        Shape::Keys(1_000),
    ))
    .chain(per_key)
    .collect()
}

/// In the smoke set: one key, ten keys, a thousand, against unordered.
const QUICK: [&str; 4] = [
    UNORDERED,
    "per-key-1-key",
    "per-key-10-keys",
    "per-key-1k-keys",
];

/// Below this ratio to the unordered drain of the same run, the scenario
/// fails even in the smoke set: far from noise, it is a relay idling
/// while work waits.
const STALL_FLOOR: f64 = 0.25;

const DIALECTS: [&str; 3] = ["postgres", "mariadb", "sqlite"];

/// Scenario name per dialect.
pub fn name(dialect: &str) -> String {
    format!("keys-{dialect}")
}

/// Runs the scenario for every dialect and checks its targets.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let mut stalls = Vec::new();
    for dialect in DIALECTS {
        let n = match dialect {
            "postgres" => scale.pick(100_000, 2_000),
            _ => scale.pick(20_000, 2_000),
        };
        let mut rounds = Rounds::default();
        for round in 0..scale.rounds {
            for (contender, ordering, shape) in contenders() {
                let wanted = scale.includes(&contender) || scale.includes(dialect);
                if !wanted || (scale.quick && !QUICK.contains(&contender.as_str())) {
                    continue;
                }
                let keys = keys_of(shape, round, n);
                let elapsed = drain(dialect, ordering, round, &keys).await?;
                query_count::print_profile(&format!("{dialect} {contender} round {round}"));
                let events_per_second = rate(n as u64, elapsed);
                rounds.add(&contender, "events/s", events_per_second, true);
                progress(format!(
                    "round {round} {dialect} {contender}: {events_per_second:.0} events/s"
                ));
            }
        }
        let scenario = name(dialect);
        rounds.finish(&scenario, report);
        stalls.extend(check(report, &scenario));
    }
    if stalls.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "ordered drains below {STALL_FLOOR}x the unordered drain: {}",
            stalls.join(", ")
        )
        .into())
    }
}

/// Records the targets of one dialect; returns the contenders that stalled.
fn check(report: &mut Report, scenario: &str) -> Vec<String> {
    let unordered = report.median(scenario, UNORDERED, "events/s");
    let mut stalls = Vec::new();
    for (contender, ordering, shape) in contenders() {
        let (Some(per_key), Some(unordered)) =
            (report.median(scenario, &contender, "events/s"), unordered)
        else {
            continue;
        };
        if ordering == Ordering::Unordered {
            continue;
        }
        let ratio = per_key / unordered;
        let bound = match shape {
            Shape::Keys(1) => 0.5,
            _ => 0.7,
        };
        report.target(TargetCheck::at_least(
            format!("{scenario}: {contender} / unordered"),
            ratio,
            bound,
        ));
        if ratio < STALL_FLOOR {
            stalls.push(format!("{scenario} {contender} {ratio:.3}"));
        }
    }
    stalls
}

/// The key of each of `n` events.
pub fn keys_of(shape: Shape, round: usize, n: usize) -> Vec<usize> {
    match shape {
        Shape::Keys(keys) => (0..n).map(|i| i % keys).collect(),
        Shape::Zipf => {
            let mut cumulative = Vec::with_capacity(ZIPF_KEYS);
            let mut total = 0.0;
            for k in 1..=ZIPF_KEYS {
                total += 1.0 / k as f64;
                cumulative.push(total);
            }
            let random = SplitMix64::seeded(round as u64 + 1);
            (0..n)
                .map(|_| {
                    let u = random.next_unit() * total;
                    cumulative.partition_point(|&c| c < u).min(ZIPF_KEYS - 1)
                })
                .collect()
        }
    }
}

/// Fills `dialect`'s outbox with one event per entry of `keys` and drains
/// it with one relay at default settings and `ordering`.
async fn drain(
    dialect: &str,
    ordering: Ordering,
    round: usize,
    keys: &[usize],
) -> Result<std::time::Duration, Error> {
    let n = keys.len();
    let event = |i: usize| env::event_for_key(round, i, keys[i]);
    let config = RelayConfig {
        ordering,
        ..RelayConfig::default()
    };
    let publisher = Arc::new(CountingPublisher::noop(config.batch_size));
    match dialect {
        "postgres" => {
            let pool = env::pg_pool(8).await?;
            let store = Arc::new(env::pg_store(&pool).await?);
            env::pg_reset(&pool).await?;
            env::pg_fill_with(&store, n, event).await?;
            query_count::reset_profile();
            let elapsed = relay_run::drain(store, publisher, config, 1, n as u64).await;
            pool.close().await;
            elapsed
        }
        "mariadb" => {
            let store = Arc::new(env::mysql_store(8).await?);
            env::mysql_reset(&store).await?;
            env::fill_writer(store.as_ref(), n, event).await?;
            query_count::reset_profile();
            let elapsed = relay_run::drain(store.clone(), publisher, config, 1, n as u64).await;
            store.pool().close().await;
            elapsed
        }
        _ => {
            let store =
                Arc::new(env::sqlite_store(std::path::Path::new("target/bench/sqlite")).await?);
            env::fill_writer(store.as_ref(), n, event).await?;
            query_count::reset_profile();
            let elapsed = relay_run::drain(store.clone(), publisher, config, 1, n as u64).await;
            store.pool().close().await;
            elapsed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_has_a_hot_key_and_a_long_tail() {
        let keys = keys_of(Shape::Zipf, 0, 100_000);
        let hot = keys.iter().filter(|&&k| k == 0).count();
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert!((8_000..12_000).contains(&hot), "key 0 took {hot}");
        assert!(distinct.len() > 5_000, "{} distinct keys", distinct.len());
    }
}
