//! The scenarios. Each runs its contenders interleaved, round by round, so
//! drift in the machine (fsync varies several-fold over a day) hits every
//! contender alike, and records the medians and target ratios.

pub mod brokers;
pub mod claim;
mod claim_aside;
mod claim_waiting;
pub mod dashboard;
pub mod dialects;
pub mod drain;
pub mod drain_sql;
pub mod enqueue;
pub mod hot_key;
pub mod keys;
pub mod latency;
pub mod pgq;
pub mod read_view;
pub mod tenants;
pub mod tenants_daemon;
pub mod tenants_mariadb;
pub mod week;

use std::collections::BTreeMap;

use crate::report::{Figure, Report};
use crate::stats::Samples;

/// How big and how often: the full set or the CI smoke set.
#[derive(Clone, Debug)]
pub struct Scale {
    /// Rounds per contender (interleaved).
    pub rounds: usize,
    /// True for the `--quick` smoke set: small inputs, figures not comparable.
    pub quick: bool,
    /// Only contenders whose name contains this (`--only`), for profiling
    /// one contender; targets then compare against missing figures (NaN).
    pub only: Option<String>,
    /// Relays the PostgreSQL drain runs side by side in this process
    /// (`--relays`, default 1).
    pub relays: usize,
}

impl Scale {
    /// `full` when measuring, `quick` when smoke-testing.
    pub fn pick(&self, full: usize, quick: usize) -> usize {
        if self.quick { quick } else { full }
    }

    /// Whether `contender` runs in this invocation.
    pub fn includes(&self, contender: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|only| contender.contains(only))
    }
}

/// Samples gathered per (contender, metric) across rounds, in first-seen order.
#[derive(Default)]
pub struct Rounds {
    order: Vec<(String, String)>,
    samples: BTreeMap<(String, String), (Samples, bool)>,
}

impl Rounds {
    /// Adds one round's value; `higher_is_better` orders the plots.
    pub fn add(&mut self, contender: &str, metric: &str, value: f64, higher_is_better: bool) {
        let key = (contender.to_string(), metric.to_string());
        if !self.samples.contains_key(&key) {
            self.order.push(key.clone());
        }
        self.samples
            .entry(key)
            .or_insert_with(|| (Samples::default(), higher_is_better))
            .0
            .0
            .push(value);
    }

    /// Moves every figure into the report under `scenario` and prints its table.
    pub fn finish(mut self, scenario: &str, report: &mut Report) {
        for key in &self.order {
            let (samples, higher_is_better) = self.samples.remove(key).expect("recorded key");
            report.figure(Figure {
                scenario: scenario.to_string(),
                contender: key.0.clone(),
                metric: key.1.clone(),
                samples,
                higher_is_better,
            });
        }
        report.print_scenario(scenario);
    }
}

/// Events per second.
pub fn rate(events: u64, elapsed: std::time::Duration) -> f64 {
    events as f64 / elapsed.as_secs_f64()
}

/// Progress on stderr, so stdout stays the table.
pub fn progress(message: impl std::fmt::Display) {
    eprintln!("  .. {message}");
}
