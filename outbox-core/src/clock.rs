//! Time as a dependency, so tests control it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// The store's notion of "now": lease expiry, backoff and ages are measured on it.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// The system wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to. Clones share one time.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<Mutex<DateTime<Utc>>>);

impl ManualClock {
    /// A clock frozen at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self(Arc::new(Mutex::new(start)))
    }

    /// A clock frozen at a fixed, arbitrary instant (2026-01-01T00:00:00Z).
    pub fn at_epoch() -> Self {
        Self::new(DateTime::from_timestamp(1_767_225_600, 0).expect("valid timestamp"))
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock().expect("clock lock");
        *now += chrono::Duration::from_std(by).expect("duration in range");
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().expect("clock lock")
    }
}

/// `a - b` as a std duration, zero when `b` is later.
pub fn elapsed_between(later: DateTime<Utc>, earlier: DateTime<Utc>) -> Duration {
    (later - earlier).to_std().unwrap_or(Duration::ZERO)
}

/// `at + by`, saturating at the largest representable time.
pub fn add_duration(at: DateTime<Utc>, by: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(by)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}
