//! Retry policy for transient publish failures, as data.

use std::time::Duration;

use super::RandomSource;

/// Exponential backoff with jitter, capped, with a bound on attempts.
///
/// Defaults: 10 attempts, 1 s initial interval, ×2 per attempt, capped at
/// 5 min, ±20 % jitter.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Failed attempts after which an event is moved to `failed`.
    pub max_attempts: u32,
    /// Delay after the first failure.
    pub initial_interval: Duration,
    /// Largest delay.
    pub max_interval: Duration,
    /// Growth factor per failed attempt.
    pub multiplier: f64,
    /// Fraction of the delay randomised, in `[0, 1]`: the delay is drawn
    /// uniformly from `delay × [1 - jitter, 1 + jitter]`.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 10,
            initial_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(300),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }
}

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// Try again once `after` has passed.
    RetryAfter(Duration),
    /// The attempt budget is spent.
    GiveUp,
}

impl RetryPolicy {
    /// A policy that retries immediately, without jitter (tests, benchmarks).
    pub fn immediate(max_attempts: u32) -> Self {
        Self {
            max_attempts,
            initial_interval: Duration::ZERO,
            max_interval: Duration::ZERO,
            multiplier: 1.0,
            jitter: 0.0,
        }
    }

    /// Retrying a consumer's handler in place (the consumer waits, so keep
    /// it short): 5 attempts, 100 ms doubling to at most 5 s, ±20 % jitter.
    pub fn in_place() -> Self {
        Self {
            max_attempts: 5,
            initial_interval: Duration::from_millis(100),
            max_interval: Duration::from_secs(5),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }

    /// Sets `max_attempts`.
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Checks the policy is usable.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("retry.max_attempts must be at least 1".into());
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err("retry.multiplier must be a finite number >= 1".into());
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err("retry.jitter must be within [0, 1]".into());
        }
        if self.initial_interval > self.max_interval {
            return Err("retry.initial_interval must not exceed retry.max_interval".into());
        }
        Ok(())
    }

    /// The decision after `failed_attempts` failures (counting the one that
    /// just happened).
    pub fn decide(&self, failed_attempts: u32, random: &dyn RandomSource) -> RetryDecision {
        if failed_attempts >= self.max_attempts {
            return RetryDecision::GiveUp;
        }
        RetryDecision::RetryAfter(self.backoff(failed_attempts, random))
    }

    /// Delay before the next attempt after `failed_attempts` failures.
    pub fn backoff(&self, failed_attempts: u32, random: &dyn RandomSource) -> Duration {
        let exponent = failed_attempts.saturating_sub(1).min(64) as i32;
        let base = self.initial_interval.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = base.min(self.max_interval.as_secs_f64());
        let spread = 1.0 + self.jitter * (2.0 * random.next_unit() - 1.0);
        Duration::from_secs_f64((capped * spread).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::FixedRandom;

    #[test]
    fn grows_exponentially_then_caps() {
        let policy = RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        let mid = FixedRandom(0.5);
        assert_eq!(policy.backoff(1, &mid), Duration::from_secs(1));
        assert_eq!(policy.backoff(2, &mid), Duration::from_secs(2));
        assert_eq!(policy.backoff(4, &mid), Duration::from_secs(8));
        assert_eq!(policy.backoff(30, &mid), Duration::from_secs(300));
    }

    #[test]
    fn jitter_spreads_within_bounds() {
        let policy = RetryPolicy::default();
        let low = policy.backoff(3, &FixedRandom(0.0));
        let high = policy.backoff(3, &FixedRandom(0.999_999));
        assert_eq!(low, Duration::from_secs_f64(3.2));
        assert!(high > Duration::from_secs_f64(4.79) && high <= Duration::from_secs_f64(4.8));
    }

    #[test]
    fn gives_up_at_max_attempts() {
        let policy = RetryPolicy::default().with_max_attempts(3);
        let r = FixedRandom(0.5);
        assert!(matches!(policy.decide(2, &r), RetryDecision::RetryAfter(_)));
        assert_eq!(policy.decide(3, &r), RetryDecision::GiveUp);
    }

    #[test]
    fn rejects_nonsense() {
        assert!(
            RetryPolicy::default()
                .with_max_attempts(0)
                .validate()
                .is_err()
        );
        let bad = RetryPolicy {
            jitter: 1.5,
            ..RetryPolicy::default()
        };
        assert!(bad.validate().is_err());
        assert!(RetryPolicy::default().validate().is_ok());
    }
}
