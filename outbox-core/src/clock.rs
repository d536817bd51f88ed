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
pub struct ManualClock {
    now: Arc<Mutex<DateTime<Utc>>>,
    start: DateTime<Utc>,
}

impl ManualClock {
    /// A clock frozen at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: Arc::new(Mutex::new(start)),
            start,
        }
    }

    /// How far the clock has been moved since it was made.
    pub fn advanced(&self) -> Duration {
        elapsed_between(self.now(), self.start)
    }

    /// A clock frozen at a fixed, arbitrary instant (2026-01-01T00:00:00Z).
    pub fn at_epoch() -> Self {
        Self::new(DateTime::from_timestamp(1_767_225_600, 0).expect("valid timestamp"))
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().expect("clock lock");
        *now += chrono::Duration::from_std(by).expect("duration in range");
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().expect("clock lock")
    }
}

/// Another clock read `by` ahead (or behind, if negative): a host whose
/// clock is off, for tests that prove nothing depends on it. The skew can
/// be [stepped](SkewedClock::step) mid-run (an NTP correction, a VM restored
/// from a snapshot); clones share it.
#[derive(Clone, Debug)]
pub struct SkewedClock {
    base: Arc<dyn Clock>,
    by: Arc<Mutex<chrono::Duration>>,
}

impl SkewedClock {
    /// `base` read `by` later.
    pub fn new(base: Arc<dyn Clock>, by: chrono::Duration) -> Self {
        Self {
            base,
            by: Arc::new(Mutex::new(by)),
        }
    }

    /// Moves this clock (and its clones) `by` further from its base.
    pub fn step(&self, by: chrono::Duration) {
        *self.by.lock().expect("skew lock") += by;
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> DateTime<Utc> {
        self.base.now() + *self.by.lock().expect("skew lock")
    }
}

/// Where a store takes "now" from for every lease, delay, backoff and age
/// it stores or compares.
///
/// A store shared by relays and producers on many hosts must not trust any
/// one host's clock: SQL stores use the database server's clock, so a relay
/// host minutes off changes nothing. The host clock a store is given
/// (`StoreConfig::clock` in `outbox-sqlx`) only turns an absolute
/// `available_at` into a delay from "now" on that host.
#[derive(Clone, Debug, Default)]
pub enum StoreTime {
    /// The database server's clock (the default).
    #[default]
    Database,
    /// The database clock plus however far `clock` has been
    /// [advanced](ManualClock::advanced): tests drive lease expiry and
    /// backoff without sleeping. Every handle on one store shares the clock
    /// (the shift is kept in the database, so all of them agree). A store
    /// writes the shift at the start of its own operations (claims,
    /// settlements, its own enqueue and inbox transactions), never from
    /// inside a caller's transaction.
    Shifted(ManualClock),
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
