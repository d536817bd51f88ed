//! What every broker's consumer holds beside its client, once: the inbox,
//! the handler, the two policies with their jitter, and the run loop's
//! count of steps failed in a row.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Applier;
use crate::policy::{RetryPolicy, SplitMix64};
use crate::relay::OutagePolicy;

/// The part of a broker consumer that applies deliveries and paces its
/// run loop; the broker's own part receives, acknowledges and
/// dead-letters.
pub struct Consuming<I, H> {
    /// The inbox the claims commit in.
    pub inbox: I,
    /// What applies an event.
    pub handler: H,
    handler_retry: RetryPolicy,
    store_outage: OutagePolicy,
    random: SplitMix64,
    failed_in_a_row: u32,
}

impl<I, H> Consuming<I, H> {
    /// `inbox` and `handler` under the consumer settings' two policies
    /// (already validated: [`super::validate_policies`]).
    pub fn new(
        inbox: I,
        handler: H,
        handler_retry: &RetryPolicy,
        store_outage: &OutagePolicy,
    ) -> Self {
        Self {
            inbox,
            handler,
            handler_retry: handler_retry.clone(),
            store_outage: store_outage.clone(),
            random: SplitMix64::from_entropy(),
            failed_in_a_row: 0,
        }
    }

    /// An [`Applier`] for one delivery (or batch) under `consumer`'s name;
    /// its pauses end at `shutdown`.
    pub fn applier<'a>(
        &'a self,
        consumer: &'a str,
        shutdown: &'a CancellationToken,
    ) -> Applier<'a, I, H> {
        Applier {
            inbox: &self.inbox,
            consumer,
            handler: &self.handler,
            handler_retry: &self.handler_retry,
            store_outage: &self.store_outage,
            random: &self.random,
            shutdown,
            store_retries: 0,
        }
    }

    /// A step of the run loop went through: the next failure pauses from
    /// the start again.
    pub fn step_succeeded(&mut self) {
        self.failed_in_a_row = 0;
    }

    /// A step of the run loop failed (the broker or the store is down):
    /// how long to pause before the next, growing with each failure in a
    /// row per the store-outage policy.
    pub fn step_failed(&mut self) -> Duration {
        self.failed_in_a_row += 1;
        self.outage_pause(self.failed_in_a_row)
    }

    /// The store-outage policy's pause after `in_a_row` failures (1 for
    /// the first), for a loop that counts its own.
    pub fn outage_pause(&self, in_a_row: u32) -> Duration {
        self.store_outage.pause(in_a_row, &self.random)
    }
}

/// Sleeps `pause`, or less if `shutdown` comes first; says whether it
/// slept the whole pause.
pub async fn pause_unless_shut_down(pause: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(pause) => true,
        _ = shutdown.cancelled() => false,
    }
}
