//! [`FairShare`]: a tenant draining a backlog rests while others are served.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::relay::{BatchDone, Pace};

/// How a fleet shares the database server, and this process, between
/// tenants draining a backlog and tenants serving fresh events.
///
/// A tenant whose claims come back full has a backlog: left alone, its
/// relay claims again at once, and on a small server its drain takes the
/// cores every other tenant's single event needs. While another tenant
/// has served fresh events (a claim that was not full, after one that was
/// not full either: the last batch of a backlog is not fresh) within
/// `serving_window`, a backlogged tenant rests `backlog_rest` times its
/// last batch's time before its next claim. With no one else served, it
/// drains at full speed.
#[derive(Clone, Debug, PartialEq)]
pub struct FairShare {
    /// The rest after a full batch, as a multiple of that batch's time
    /// (and at most `serving_window`), while another tenant is being
    /// served: 1.0 gives a backlog at most half of its relay's time, the
    /// default 3.0 a quarter, 0.0 turns resting off. (On 2 cores, a quiet
    /// tenant's p99 beside a draining one was 2.0 times its p99 alone
    /// without resting, 1.7 with 1.0, 1.3 with 3.0: BENCHMARKS.md.)
    pub backlog_rest: f64,
    /// How long after its last batch a tenant counts as being served.
    /// Default 1 s.
    pub serving_window: Duration,
}

impl Default for FairShare {
    fn default() -> Self {
        Self {
            backlog_rest: 3.0,
            serving_window: Duration::from_secs(1),
        }
    }
}

impl FairShare {
    /// Checks the policy is usable.
    pub fn validate(&self) -> Result<(), String> {
        if !self.backlog_rest.is_finite() || self.backlog_rest < 0.0 {
            return Err(format!(
                "backlog_rest must be a finite number >= 0 (got {})",
                self.backlog_rest
            ));
        }
        Ok(())
    }
}

/// The last two distinct tenants served, newest first: enough to answer
/// "has anyone but me been served lately" in constant time, whatever the
/// number of tenants.
#[derive(Debug, Default)]
struct Served {
    latest: Option<(u64, Instant)>,
    before: Option<(u64, Instant)>,
}

impl Served {
    fn record(&mut self, tenant: u64, at: Instant) {
        match self.latest {
            Some((latest, _)) if latest == tenant => {}
            _ => self.before = self.latest,
        }
        self.latest = Some((tenant, at));
    }

    fn other_since(&self, tenant: u64, since: Instant) -> bool {
        [self.latest, self.before]
            .into_iter()
            .flatten()
            .any(|(served, at)| served != tenant && at >= since)
    }
}

/// One fleet's record of who was served, shared by its tenants' relays.
#[derive(Clone, Debug, Default)]
pub(super) struct ShareBoard {
    policy: FairShare,
    served: Arc<Mutex<Served>>,
    next_id: Arc<std::sync::atomic::AtomicU64>,
}

impl ShareBoard {
    pub(super) fn new(policy: FairShare) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }

    /// A pace for one tenant's relay (each start gets its own seat).
    pub(super) fn seat(&self) -> TenantPace {
        TenantPace {
            board: self.clone(),
            id: self
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            was_full: Default::default(),
        }
    }
}

/// One tenant's relay's [`Pace`] under its fleet's [`FairShare`].
#[derive(Debug)]
pub(super) struct TenantPace {
    board: ShareBoard,
    id: u64,
    /// Whether this tenant's last batch was full: the short batch that
    /// ends a backlog is not yet fresh events being served.
    was_full: std::sync::atomic::AtomicBool,
}

impl Pace for TenantPace {
    fn rest_after(&self, batch: &BatchDone) -> Duration {
        let policy = &self.board.policy;
        let now = Instant::now();
        let was_full = self
            .was_full
            .swap(batch.full, std::sync::atomic::Ordering::Relaxed);
        if !batch.full {
            if batch.events > 0 && !was_full {
                let mut served = self.board.served.lock().expect("share board");
                served.record(self.id, now);
            }
            return Duration::ZERO;
        }
        let since = now.checked_sub(policy.serving_window).unwrap_or(now);
        let others_served = || {
            let served = self.board.served.lock().expect("share board");
            served.other_since(self.id, since)
        };
        if policy.backlog_rest > 0.0 && others_served() {
            Duration::try_from_secs_f64(batch.busy.as_secs_f64() * policy.backlog_rest)
                .unwrap_or(Duration::MAX)
                .min(policy.serving_window)
        } else {
            Duration::ZERO
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(events: usize, full: bool) -> BatchDone {
        BatchDone {
            events,
            full,
            busy: Duration::from_millis(8),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_backlog_rests_only_while_another_tenant_is_served() {
        let board = ShareBoard::new(FairShare {
            backlog_rest: 1.0,
            ..FairShare::default()
        });
        let (hot, quiet, idle) = (board.seat(), board.seat(), board.seat());
        assert_eq!(hot.rest_after(&batch(256, true)), Duration::ZERO, "alone");
        assert_eq!(idle.rest_after(&batch(0, false)), Duration::ZERO);
        assert_eq!(
            hot.rest_after(&batch(256, true)),
            Duration::ZERO,
            "an idle tenant's empty claim is not being served"
        );
        assert_eq!(hot.rest_after(&batch(3, false)), Duration::ZERO);
        assert_eq!(
            hot.rest_after(&batch(256, true)),
            Duration::ZERO,
            "its own short batch does not slow it"
        );
        assert_eq!(quiet.rest_after(&batch(3, false)), Duration::ZERO);
        assert_eq!(
            hot.rest_after(&batch(256, true)),
            Duration::from_millis(8),
            "a quiet tenant was served: rest as long as the batch took"
        );
        assert_eq!(
            quiet.rest_after(&batch(256, true)),
            Duration::ZERO,
            "the hot one's short batch came after a full one: not fresh events"
        );
        tokio::time::advance(Duration::from_millis(1_001)).await;
        assert_eq!(
            hot.rest_after(&batch(256, true)),
            Duration::ZERO,
            "no one served within the window"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_other_tenant_is_remembered_behind_the_latest_one() {
        let board = ShareBoard::new(FairShare {
            backlog_rest: 0.5,
            ..FairShare::default()
        });
        let (hot, quiet) = (board.seat(), board.seat());
        quiet.rest_after(&batch(1, false));
        hot.rest_after(&batch(1, false));
        assert_eq!(
            hot.rest_after(&batch(256, true)),
            Duration::from_millis(4),
            "the hot one was served last, the quiet one before it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_rest_is_at_most_the_serving_window() {
        let board = ShareBoard::new(FairShare::default());
        let (hot, quiet) = (board.seat(), board.seat());
        quiet.rest_after(&batch(1, false));
        let slow = BatchDone {
            busy: Duration::from_secs(2),
            ..batch(256, true)
        };
        assert_eq!(hot.rest_after(&slow), Duration::from_secs(1));
        assert_eq!(
            hot.rest_after(&batch(256, true)),
            Duration::from_millis(24),
            "three times the batch by default"
        );
    }

    /// Many tenants draining at once: each one's last, short batch must
    /// not slow the others as if it were a quiet tenant.
    #[tokio::test(start_paused = true)]
    async fn the_end_of_a_backlog_is_not_a_tenant_being_served() {
        let board = ShareBoard::new(FairShare::default());
        let (one, other) = (board.seat(), board.seat());
        other.rest_after(&batch(256, true));
        other.rest_after(&batch(17, false));
        assert_eq!(one.rest_after(&batch(256, true)), Duration::ZERO);
        other.rest_after(&batch(2, false));
        assert_eq!(
            one.rest_after(&batch(256, true)),
            Duration::from_millis(24),
            "a second short batch is fresh events"
        );
    }

    #[test]
    fn resting_off_and_bad_policies() {
        assert!(FairShare::default().validate().is_ok());
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let policy = FairShare {
                backlog_rest: bad,
                ..FairShare::default()
            };
            assert!(policy.validate().unwrap_err().contains("backlog_rest"));
        }
    }
}
