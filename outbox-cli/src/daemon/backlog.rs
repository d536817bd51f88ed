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

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::store::Store;

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
    metrics::describe_gauge!(
        LAG_SECONDS,
        metrics::Unit::Seconds,
        "How long the oldest claimable event of a type has been due (0 when none is), as of outbox_backlog_read_timestamp_seconds."
    );
    metrics::describe_gauge!(
        READ_AT,
        metrics::Unit::Seconds,
        "When the backlog gauges were last read from the store (Unix time)."
    );
    metrics::describe_gauge!(
        READ_SECONDS,
        metrics::Unit::Seconds,
        "How long the last read of the backlog gauges took."
    );
    metrics::describe_counter!(
        STORE_ERRORS,
        metrics::Unit::Count,
        "Store errors of the daemon's own reads, per operation."
    );
    metrics::counter!(STORE_ERRORS, "operation" => "stats").increment(0);
}

/// The backlog gauges over one store.
pub struct BacklogGauges {
    store: Store,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// When the last read finished, and how long it took.
    last: Option<(Instant, Duration)>,
    /// The running read: true once it finished.
    running: Option<watch::Receiver<bool>>,
    /// Types seen by earlier reads: one that drained may be missing from
    /// the store's answer, and its gauges must read 0, not their last value.
    seen: std::collections::BTreeSet<String>,
}

impl BacklogGauges {
    /// Gauges over `store`, not read yet.
    pub fn new(store: Store) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            store,
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
        let read = self.store.admin().stats().await;
        let took = started.elapsed();
        let mut state = self.state();
        let mut stats = match read {
            Ok(stats) => {
                state.last = Some((Instant::now(), took));
                stats
            }
            Err(error) => {
                // A failed read cost the store nothing: the next scrape
                // after FRESH_FOR tries again, however long this one waited.
                state.last = Some((Instant::now(), Duration::ZERO));
                tracing::warn!(%error, "reading the backlog for /metrics failed");
                metrics::counter!(STORE_ERRORS, "operation" => "stats").increment(1);
                return;
            }
        };
        for event_type in state.seen.iter() {
            if !stats.iter().any(|s| &s.event_type == event_type) {
                stats.push(outbox_core::store::EventTypeStats {
                    event_type: event_type.clone(),
                    ..Default::default()
                });
            }
        }
        state
            .seen
            .extend(stats.iter().map(|s| s.event_type.clone()));
        drop(state);
        for s in stats {
            for (state, n) in s.counts() {
                metrics::gauge!(EVENTS, "event_type" => s.event_type.clone(), "state" => state)
                    .set(n as f64);
            }
            metrics::gauge!(LAG_SECONDS, "event_type" => s.event_type.clone())
                .set(s.oldest_claimable_age.map_or(0.0, |a| a.as_secs_f64()));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        metrics::gauge!(READ_AT).set(now.as_secs_f64());
        metrics::gauge!(READ_SECONDS).set(took.as_secs_f64());
    }
}
