//! The backlog gauges of `/metrics` (events per type and state, the oldest
//! claimable event's age), read from the store's `stats()`. That read
//! grows with the backlog (seconds at a million waiting), so a scrape
//! neither waits for it without end nor starts one per scraper: one read
//! runs at a time, a read less than ten times its own length old (and at
//! least [`FRESH_FOR`]) is served as it is, and a scrape waits at most
//! [`WAIT`] for a running read before it answers with the last values. A
//! read a scrape gave up on finishes in the background and sets the
//! gauges for the next one. `outbox_backlog_read_timestamp_seconds` says
//! when the values were read.
//!
//! A fleet's gauges carry a `tenant` label: one read goes over every
//! running tenant in turn (so its length, and with it the pause before the
//! next, grows with the tenants); a tenant whose read fails keeps its last
//! values and counts a store error; a tenant that is gone reads 0.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::store::EventTypeStats;
use tokio::sync::watch;

use super::served::Served;

/// Gauge: events per type and state (`claimable`, `parked`, `blocked`,
/// `in_flight`, `failed`).
pub const EVENTS: &str = "outbox_events";
/// Gauge: how long the oldest claimable event of a type has been due (0
/// when none is): the relay's lag.
pub const LAG_SECONDS: &str = "outbox_oldest_claimable_age_seconds";
/// Gauge: when the backlog gauges were read (Unix time, seconds).
pub const READ_AT: &str = "outbox_backlog_read_timestamp_seconds";
/// Gauge: how long that read took.
pub const READ_SECONDS: &str = "outbox_backlog_read_seconds";
/// Counter: store errors of the daemon's own reads, by `operation`.
pub const STORE_ERRORS: &str = "outbox_store_errors_total";

/// A read this recent is served without another.
pub const FRESH_FOR: Duration = Duration::from_secs(1);
/// How long a scrape waits for a running read.
pub const WAIT: Duration = Duration::from_secs(5);

/// Describes the gauges and sets the error counter at 0.
pub fn describe() {
    metrics::describe_gauge!(
        EVENTS,
        "Events per type and state (claimable, parked, blocked, in_flight, failed), as of outbox_backlog_read_timestamp_seconds."
    );
    let seconds = [
        (
            LAG_SECONDS,
            "How long the oldest claimable event of a type has been due (0 when none is), as of outbox_backlog_read_timestamp_seconds.",
        ),
        (
            READ_AT,
            "When the backlog gauges were last read from the store (Unix time).",
        ),
        (
            READ_SECONDS,
            "How long the last read of the backlog gauges took.",
        ),
    ];
    for (name, help) in seconds {
        metrics::describe_gauge!(name, metrics::Unit::Seconds, help);
    }
    metrics::describe_counter!(
        STORE_ERRORS,
        metrics::Unit::Count,
        "Store errors of the daemon's own reads, per operation."
    );
    metrics::counter!(STORE_ERRORS, "operation" => "stats").increment(0);
}

/// The backlog gauges over one store, or a fleet's tenants.
pub struct BacklogGauges {
    of: Served,
    state: Mutex<State>,
}

/// An event type's gauges, in a tenant or not.
type Series = (Option<String>, String);

#[derive(Default)]
struct State {
    /// When the last read finished, and how long it took.
    last: Option<(Instant, Duration)>,
    /// The running read: true once it finished.
    running: Option<watch::Receiver<bool>>,
    /// Series set by earlier reads: a type that drained may be missing
    /// from the store's answer (a tenant may be gone), and its gauges must
    /// read 0, not their last value.
    seen: BTreeSet<Series>,
}

impl BacklogGauges {
    /// Gauges over `of`, not read yet.
    pub fn new(of: Served) -> Arc<Self> {
        Arc::new(Self {
            of,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings the gauges up to date for a scrape, as far as [`WAIT`] allows.
    pub async fn refresh(self: &std::sync::Arc<Self>) {
        let mut done = {
            let mut state = self.state();
            if let Some((finished, took)) = state.last {
                if finished.elapsed() < FRESH_FOR.max(took * 10) {
                    return;
                }
            }
            match &state.running {
                Some(running) => running.clone(),
                None => {
                    let (finish, done) = watch::channel(false);
                    state.running = Some(done.clone());
                    let gauges = self.clone();
                    tokio::spawn(async move {
                        gauges.read().await;
                        gauges.state().running = None;
                        let _ = finish.send(true);
                    });
                    done
                }
            }
        };
        let _ = tokio::time::timeout(WAIT, done.wait_for(|finished| *finished)).await;
    }

    async fn read(&self) {
        let started = Instant::now();
        let mut stats: Vec<TenantStats> = Vec::new();
        // Tenants whose read failed: their gauges keep their values.
        let mut kept = BTreeSet::new();
        for (tenant, store) in self.of.stores() {
            let label = tenant.as_ref().map(|t| t.to_string());
            match async { store?.admin().stats().await }.await {
                Ok(read) => stats.extend(read.into_iter().map(|s| (label.clone(), s))),
                Err(error) => {
                    tracing::warn!(%error, tenant = label.as_deref(), "reading the backlog for /metrics failed");
                    metrics::counter!(STORE_ERRORS, "operation" => "stats").increment(1);
                    kept.insert(label);
                }
            }
        }
        if stats.is_empty() && !kept.is_empty() {
            // Every read failed: the gauges keep their values and time, and
            // as a failed read cost the store nothing, the next scrape after
            // FRESH_FOR tries again, however long this one waited.
            self.state().last = Some((Instant::now(), Duration::ZERO));
            return;
        }
        let took = started.elapsed();
        let stats = {
            let mut state = self.state();
            state.last = Some((Instant::now(), took));
            zero_what_is_gone(&mut state.seen, stats, &kept)
        };
        for (tenant, s) in stats {
            let labels = |more: Vec<(&'static str, String)>| {
                let mut labels = vec![metrics::Label::new("event_type", s.event_type.clone())];
                labels.extend(more.into_iter().map(|(k, v)| metrics::Label::new(k, v)));
                if let Some(tenant) = &tenant {
                    labels.push(metrics::Label::new("tenant", tenant.clone()));
                }
                labels
            };
            for (state, n) in s.counts() {
                metrics::gauge!(EVENTS, labels(vec![("state", state.to_owned())])).set(n as f64);
            }
            metrics::gauge!(LAG_SECONDS, labels(Vec::new()))
                .set(s.oldest_claimable_age.map_or(0.0, |a| a.as_secs_f64()));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        metrics::gauge!(READ_AT).set(now.as_secs_f64());
        metrics::gauge!(READ_SECONDS).set(took.as_secs_f64());
    }
}

/// An event type's stats, in a tenant or not.
type TenantStats = (Option<String>, EventTypeStats);

/// `stats` plus a zero for every series seen before and missing now
/// (unless its tenant's read failed: it keeps its values); remembers what
/// is set.
fn zero_what_is_gone(
    seen: &mut BTreeSet<Series>,
    mut stats: Vec<TenantStats>,
    kept: &BTreeSet<Option<String>>,
) -> Vec<TenantStats> {
    let now: BTreeSet<Series> = stats
        .iter()
        .map(|(tenant, s)| (tenant.clone(), s.event_type.clone()))
        .collect();
    seen.retain(|(tenant, event_type)| {
        if kept.contains(tenant) || now.contains(&(tenant.clone(), event_type.clone())) {
            return true;
        }
        stats.push((
            tenant.clone(),
            EventTypeStats {
                event_type: event_type.clone(),
                ..Default::default()
            },
        ));
        // A tenant that is gone is zeroed once and forgotten; a type that
        // drained in a live store stays, at 0.
        tenant.is_none() || now.iter().any(|(t, _)| t == tenant)
    });
    seen.extend(now);
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(
        tenant: Option<&str>,
        event_type: &str,
        claimable: u64,
    ) -> (Option<String>, EventTypeStats) {
        (
            tenant.map(str::to_owned),
            EventTypeStats {
                event_type: event_type.into(),
                claimable,
                ..Default::default()
            },
        )
    }

    fn claimable(read: &[TenantStats]) -> Vec<(Option<&str>, &str, u64)> {
        let mut seen: Vec<_> = read
            .iter()
            .map(|(t, s)| (t.as_deref(), s.event_type.as_str(), s.claimable))
            .collect();
        seen.sort();
        seen
    }

    #[test]
    fn drained_types_and_gone_tenants_read_zero_and_failed_reads_keep_theirs() {
        let mut seen = BTreeSet::new();
        let none = BTreeSet::new();
        let first = vec![
            stats(Some("a"), "paid", 3),
            stats(Some("a"), "sent", 1),
            stats(Some("b"), "paid", 2),
            stats(Some("c"), "paid", 5),
        ];
        zero_what_is_gone(&mut seen, first, &none);

        // a's "sent" drained, b is gone, c's read failed.
        let kept = BTreeSet::from([Some("c".to_owned())]);
        let second = zero_what_is_gone(&mut seen, vec![stats(Some("a"), "paid", 4)], &kept);
        assert_eq!(
            claimable(&second),
            [
                (Some("a"), "paid", 4),
                (Some("a"), "sent", 0),
                (Some("b"), "paid", 0)
            ]
        );
        // b is forgotten once zeroed; a's drained type stays at 0; c is still known.
        let third = zero_what_is_gone(&mut seen, vec![stats(Some("a"), "paid", 4)], &none);
        assert_eq!(
            claimable(&third),
            [
                (Some("a"), "paid", 4),
                (Some("a"), "sent", 0),
                (Some("c"), "paid", 0)
            ]
        );
    }

    #[test]
    fn one_store_keeps_its_drained_types_at_zero() {
        let mut seen = BTreeSet::new();
        zero_what_is_gone(&mut seen, vec![stats(None, "paid", 3)], &BTreeSet::new());
        for _ in 0..2 {
            let read = zero_what_is_gone(&mut seen, Vec::new(), &BTreeSet::new());
            assert_eq!(claimable(&read), [(None, "paid", 0)]);
        }
    }
}
