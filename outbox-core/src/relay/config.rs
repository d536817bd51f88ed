//! Relay settings, as data with documented defaults.

use std::time::Duration;

use crate::policy::{Ordering, PoisonPolicy, RandomSource, RetryPolicy};
use crate::store::RelayId;

/// How a relay pauses while the broker is down. Doubles per consecutive
/// outage from `initial_pause` up to `max_pause`, with ±20 % jitter.
#[derive(Clone, Debug, PartialEq)]
pub struct OutagePolicy {
    /// First pause. Default 500 ms.
    pub initial_pause: Duration,
    /// Longest pause. Default 30 s.
    pub max_pause: Duration,
}

impl Default for OutagePolicy {
    fn default() -> Self {
        Self {
            initial_pause: Duration::from_millis(500),
            max_pause: Duration::from_secs(30),
        }
    }
}

impl OutagePolicy {
    /// Checks the policy is usable: a zero first pause would spin, a first
    /// pause above the longest is a mistake. `name` is the setting's name
    /// in the message (`outage`, `store_outage`).
    pub fn validate(&self, name: &str) -> Result<(), String> {
        if self.initial_pause.is_zero() || self.initial_pause > self.max_pause {
            return Err(format!(
                "{name} pauses must be non-zero and initial_pause <= max_pause (got {:?} and {:?})",
                self.initial_pause, self.max_pause
            ));
        }
        Ok(())
    }

    /// The pause after `consecutive` outages in a row (1 for the first).
    pub fn pause(&self, consecutive: u32, random: &dyn RandomSource) -> Duration {
        RetryPolicy {
            max_attempts: u32::MAX,
            initial_interval: self.initial_pause,
            max_interval: self.max_pause.max(self.initial_pause),
            multiplier: 2.0,
            jitter: 0.2,
        }
        .backoff(consecutive, random)
    }
}

/// Everything that shapes a relay's behaviour.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Lease owner and history actor. Default: `relay-<random>`.
    pub relay_id: RelayId,
    /// Most events claimed at once. Default 256.
    pub batch_size: usize,
    /// How long a claim holds its events. Default 30 s.
    pub lease_duration: Duration,
    /// Bound on one publish call; must be shorter than the lease so an
    /// attempt ends (or is abandoned) before another relay may re-claim.
    /// Default 10 s.
    pub publish_timeout: Duration,
    /// Backstop poll while idle; a wake-up hint ends the wait early. Default 1 s.
    pub poll_interval: Duration,
    /// Per-key ordering (default) or none.
    pub ordering: Ordering,
    /// What a poison event does to its key. Default `Skip`.
    pub poison: PoisonPolicy,
    /// Transient-failure retries.
    pub retry: RetryPolicy,
    /// Pauses while the broker is down.
    pub outage: OutagePolicy,
    /// Claims without outcome before an event is failed as a crash loop. Default 5.
    pub crash_loop_limit: u32,
    /// On shutdown, how long the batch in flight may take to finish before
    /// its leases are released regardless. Default 10 s.
    pub drain_timeout: Duration,
    /// Claim the next batch while publishing the current one. Default on.
    pub prefetch: bool,
    /// How often the relay records that it is alive. Default 10 s.
    pub heartbeat_interval: Duration,
    /// The tenant this relay serves (a `TenantFleet`'s relays): every
    /// metric it writes carries a `tenant` label beside `relay`. Default
    /// none.
    pub tenant: Option<String>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            relay_id: RelayId::unique("relay"),
            batch_size: 256,
            lease_duration: Duration::from_secs(30),
            publish_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            ordering: Ordering::PerKey,
            poison: PoisonPolicy::Skip,
            retry: RetryPolicy::default(),
            outage: OutagePolicy::default(),
            crash_loop_limit: 5,
            drain_timeout: Duration::from_secs(10),
            prefetch: true,
            heartbeat_interval: Duration::from_secs(10),
            tenant: None,
        }
    }
}

/// A relay setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid relay configuration: {0}")]
pub struct ConfigError(pub String);

impl RelayConfig {
    /// Checks the settings fit together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |m: &str| Err(ConfigError(m.to_owned()));
        if self.batch_size == 0 {
            return fail("batch_size must be at least 1");
        }
        if self.publish_timeout.is_zero() || self.publish_timeout >= self.lease_duration {
            return fail("publish_timeout must be non-zero and shorter than lease_duration");
        }
        if self.poll_interval.is_zero() {
            return fail("poll_interval must be non-zero");
        }
        if self.crash_loop_limit == 0 {
            return fail("crash_loop_limit must be at least 1");
        }
        self.outage.validate("outage").map_err(ConfigError)?;
        self.retry.validate().map_err(ConfigError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_timeout_must_fit_inside_the_lease() {
        let mut config = RelayConfig::default();
        assert!(config.validate().is_ok());
        config.publish_timeout = config.lease_duration;
        assert!(config.validate().unwrap_err().0.contains("publish_timeout"));
    }

    #[test]
    fn rejects_zero_sizes() {
        let config = RelayConfig {
            batch_size: 0,
            ..RelayConfig::default()
        };
        assert!(config.validate().is_err());
        let config = RelayConfig {
            crash_loop_limit: 0,
            ..RelayConfig::default()
        };
        assert!(config.validate().is_err());
    }

    /// A zero outage pause would spin against a down broker; a first pause
    /// above the longest is a mistake. Both are refused by name.
    #[test]
    fn rejects_outage_pauses_that_cannot_work() {
        for (initial, max) in [(0, 1000), (2000, 1000)] {
            let config = RelayConfig {
                outage: OutagePolicy {
                    initial_pause: Duration::from_millis(initial),
                    max_pause: Duration::from_millis(max),
                },
                ..RelayConfig::default()
            };
            let error = config.validate().unwrap_err().0;
            assert!(error.starts_with("outage pauses"), "{error}");
        }
        assert!(OutagePolicy::default().validate("outage").is_ok());
        assert!(
            crate::consume::default_store_outage()
                .validate("store_outage")
                .is_ok()
        );
    }
}
