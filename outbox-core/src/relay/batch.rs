//! One claimed batch: publish in key order, classify outcomes, settle.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use super::alert::{FailedAlert, FailureCause};
use super::metrics;
use super::runner::RelayContext;
use crate::error::StoreError;
use crate::event::StoredEvent;
use crate::policy::{Ordering, PoisonPolicy, RetryDecision};
use crate::publisher::{ErrorClass, PublishError, PublishOutcome, Publisher};
use crate::store::{
    ClaimedEvent, FailReason, Nack, NackAction, OutboxStore, Release, SettleReport,
};

/// How a batch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum BatchEnd {
    /// Every event got an outcome or was released on purpose.
    Completed,
    /// The broker is down; the relay should pause.
    Outage(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Progress {
    Waiting,
    Started,
    Decided,
}

/// A claimed batch and what has been decided about each event so far.
/// Kept outside the processing future so that, if shutdown abandons that
/// future, the decisions made so far can still be written.
pub(super) struct BatchWork {
    events: Vec<ClaimedEvent>,
    progress: Vec<Progress>,
    lease_deadline: Instant,
    acks: Vec<usize>,
    nacks: Vec<(usize, Nack)>,
    releases: Vec<Release>,
    alerts: Vec<FailedAlert>,
    pub(super) report: super::RelayReport,
}

impl BatchWork {
    pub(super) fn new(events: Vec<ClaimedEvent>, claim_started: Instant, lease: Duration) -> Self {
        let n = events.len();
        Self {
            events,
            progress: vec![Progress::Waiting; n],
            // Measured from before the claim was sent: the store's lease can
            // only end later than this.
            lease_deadline: claim_started + lease,
            acks: Vec::new(),
            nacks: Vec::new(),
            releases: Vec::new(),
            alerts: Vec::new(),
            report: Default::default(),
        }
    }

    /// Publishes the batch and writes the outcomes.
    pub(super) async fn run<S, P>(
        &mut self,
        ctx: &RelayContext<S, P>,
    ) -> Result<BatchEnd, StoreError>
    where
        S: OutboxStore + ?Sized,
        P: Publisher + ?Sized,
    {
        let end = self.publish_all(ctx).await;
        self.settle(ctx).await?;
        Ok(end)
    }

    /// Indices grouped into calls that keep per-key order: with per-key
    /// ordering and a publisher that does not keep order within a call, wave
    /// k holds the k-th event of every key in the batch.
    fn waves(&self, ctx_ordering: Ordering, publisher_keeps_order: bool) -> Vec<Vec<usize>> {
        if ctx_ordering == Ordering::Unordered || publisher_keeps_order {
            return vec![(0..self.events.len()).collect()];
        }
        let mut depth_of_key: std::collections::HashMap<&str, usize> = Default::default();
        let mut waves: Vec<Vec<usize>> = Vec::new();
        for (i, claimed) in self.events.iter().enumerate() {
            let depth = depth_of_key
                .entry(claimed.event.partition_key.as_str())
                .or_insert(0);
            if waves.len() <= *depth {
                waves.push(Vec::new());
            }
            waves[*depth].push(i);
            *depth += 1;
        }
        waves
    }

    async fn publish_all<S, P>(&mut self, ctx: &RelayContext<S, P>) -> BatchEnd
    where
        S: OutboxStore + ?Sized,
        P: Publisher + ?Sized,
    {
        let capabilities = ctx.publisher.capabilities();
        let max_batch = capabilities.max_batch.max(1);
        let ordered = ctx.config.ordering == Ordering::PerKey;
        let mut stopped_keys: HashSet<String> = HashSet::new();
        for wave in self.waves(ctx.config.ordering, capabilities.preserves_key_order) {
            let mut rest = wave.as_slice();
            while !rest.is_empty() {
                let mut chunk = Vec::with_capacity(max_batch.min(rest.len()));
                while let Some((&i, tail)) = rest.split_first() {
                    if chunk.len() == max_batch {
                        break;
                    }
                    rest = tail;
                    if !ordered || !stopped_keys.contains(&self.events[i].event.partition_key) {
                        chunk.push(i);
                    }
                }
                if chunk.is_empty() {
                    continue;
                }
                // An attempt must end before the lease can: otherwise another
                // relay may re-claim and publish a later event of the key first.
                if Instant::now() + ctx.config.publish_timeout > self.lease_deadline {
                    tracing::warn!(relay = %ctx.config.relay_id, "lease too short to publish safely; releasing the rest of the batch");
                    return BatchEnd::Completed;
                }
                let outcomes = self.publish_chunk(ctx, &chunk).await;
                if let Some(outage) = self.apply_outcomes(ctx, &chunk, outcomes, &mut stopped_keys)
                {
                    return BatchEnd::Outage(outage);
                }
            }
        }
        BatchEnd::Completed
    }

    async fn publish_chunk<S, P>(
        &mut self,
        ctx: &RelayContext<S, P>,
        chunk: &[usize],
    ) -> Vec<PublishOutcome>
    where
        S: OutboxStore + ?Sized,
        P: Publisher + ?Sized,
    {
        for &i in chunk {
            self.progress[i] = Progress::Started;
        }
        let refs: Vec<&StoredEvent> = chunk.iter().map(|&i| &self.events[i].event).collect();
        let started = Instant::now();
        let timeout = ctx.config.publish_timeout;
        let span = crate::trace::publish_span(
            ctx.config.relay_id.as_str(),
            refs.iter().map(|event| &event.headers),
        );
        let publish = tracing::Instrument::instrument(ctx.publisher.publish(&refs), span);
        let result = tokio::time::timeout(timeout, publish).await;
        metrics::seconds(metrics::PUBLISH_SECONDS, &ctx.config, started.elapsed());
        match result {
            Ok(outcomes) if outcomes.len() == chunk.len() => outcomes,
            Ok(outcomes) => {
                let message = format!(
                    "publisher returned {} outcomes for {} events",
                    outcomes.len(),
                    chunk.len()
                );
                chunk
                    .iter()
                    .map(|_| Err(PublishError::transient(message.clone())))
                    .collect()
            }
            Err(_) => {
                let message = format!("publish timed out after {timeout:?}");
                chunk
                    .iter()
                    .map(|_| Err(PublishError::transient(message.clone())))
                    .collect()
            }
        }
    }

    /// Records each outcome. Returns the outage message if the broker is down.
    fn apply_outcomes<S, P>(
        &mut self,
        ctx: &RelayContext<S, P>,
        chunk: &[usize],
        outcomes: Vec<PublishOutcome>,
        stopped_keys: &mut HashSet<String>,
    ) -> Option<String>
    where
        S: OutboxStore + ?Sized,
        P: Publisher + ?Sized,
    {
        let mut outage = None;
        let ordered = ctx.config.ordering == Ordering::PerKey;
        for (&i, outcome) in chunk.iter().zip(outcomes) {
            let key = self.events[i].event.partition_key.clone();
            self.progress[i] = Progress::Decided;
            // A key already stopped in this call: an order-keeping publisher
            // held the event back behind the earlier failure, so it was never
            // tried and goes back untouched (no attempt burned; otherwise a
            // head failing N times would exhaust its followers' attempts too).
            let held = ordered && stopped_keys.contains(&key);
            let error = match outcome {
                Ok(()) => {
                    if held {
                        // Only a publisher that claims to keep order within a
                        // call can get here, and it broke that promise.
                        tracing::error!(event_id = %self.events[i].event.event_id, "publisher delivered an event after an earlier event of its key failed in the same call");
                    }
                    self.acks.push(i);
                    continue;
                }
                Err(_) if held => {
                    self.releases.push(Release {
                        lease: self.events[i].lease.clone(),
                        attempt_started: false,
                    });
                    continue;
                }
                Err(error) => error,
            };
            match error.class {
                ErrorClass::Outage => {
                    // Nothing is wrong with the event: return it untouched.
                    self.releases.push(Release {
                        lease: self.events[i].lease.clone(),
                        attempt_started: false,
                    });
                    outage.get_or_insert(error.message);
                }
                ErrorClass::Transient => {
                    let attempts = self.events[i].event.attempts + 1;
                    match ctx.config.retry.decide(attempts, ctx.random.as_ref()) {
                        RetryDecision::RetryAfter(after) => {
                            self.nack(i, NackAction::Retry { after }, &error)
                        }
                        RetryDecision::GiveUp => {
                            self.fail(ctx, i, FailReason::AttemptsExhausted, &error)
                        }
                    }
                }
                ErrorClass::Permanent => self.fail(ctx, i, FailReason::Permanent, &error),
            }
            // Even under `Skip`, the key's later events wait for the next
            // claim: publishing them before this failure is durable would let
            // a crash re-claim the failed event and publish it after them.
            stopped_keys.insert(key);
        }
        outage
    }

    fn nack(&mut self, i: usize, action: NackAction, error: &PublishError) {
        let nack = Nack {
            lease: self.events[i].lease.clone(),
            action,
            error_class: error.class,
            error: error.message.clone(),
        };
        self.nacks.push((i, nack));
    }

    /// Dead-letters event `i`.
    fn fail<S, P>(
        &mut self,
        ctx: &RelayContext<S, P>,
        i: usize,
        reason: FailReason,
        error: &PublishError,
    ) where
        S: OutboxStore + ?Sized,
        P: Publisher + ?Sized,
    {
        let block_key = ctx.config.poison == PoisonPolicy::Block;
        self.nack(i, NackAction::Fail { reason, block_key }, error);
        self.alerts.push(FailedAlert {
            event: self.events[i].event.clone(),
            cause: match reason {
                FailReason::Permanent => FailureCause::Permanent,
                FailReason::AttemptsExhausted => FailureCause::AttemptsExhausted,
            },
            error: error.message.clone(),
            key_blocked: block_key,
        });
    }

    /// Writes every decision made so far and returns every undecided lease.
    /// Safe to call again: each decision is written once.
    pub(super) async fn settle<S, P>(&mut self, ctx: &RelayContext<S, P>) -> Result<(), StoreError>
    where
        S: OutboxStore + ?Sized,
        P: Publisher + ?Sized,
    {
        for (i, progress) in self.progress.iter_mut().enumerate() {
            if *progress != Progress::Decided {
                self.releases.push(Release {
                    lease: self.events[i].lease.clone(),
                    attempt_started: *progress == Progress::Started,
                });
                *progress = Progress::Decided;
            }
        }
        let relay = &ctx.config;
        if !self.acks.is_empty() {
            let leases: Vec<_> = self
                .acks
                .iter()
                .map(|&i| self.events[i].lease.clone())
                .collect();
            let report = with_retries(|| ctx.store.ack(&leases)).await?;
            self.acks.clear();
            self.report.published += report.applied as u64;
            metrics::count(metrics::PUBLISHED, relay, report.applied as u64);
            self.count_fenced(relay, &report);
        }
        if !self.nacks.is_empty() {
            let nacks: Vec<Nack> = self.nacks.iter().map(|(_, n)| n.clone()).collect();
            let report = with_retries(|| ctx.store.nack(&nacks)).await?;
            for (_, nack) in self.nacks.drain(..) {
                if report.fenced.contains(&nack.lease.event_id) {
                    continue;
                }
                match nack.action {
                    NackAction::Retry { .. } => {
                        self.report.retried += 1;
                        metrics::count(metrics::RETRIED, relay, 1);
                    }
                    NackAction::Fail { reason, .. } => {
                        self.report.failed += 1;
                        metrics::count_failed(
                            relay,
                            match reason {
                                FailReason::Permanent => "permanent",
                                FailReason::AttemptsExhausted => "attempts_exhausted",
                            },
                        );
                    }
                }
            }
            for alert in self.alerts.drain(..) {
                if !report.fenced.contains(&alert.event.event_id) {
                    ctx.alert.event_failed(&alert);
                }
            }
            self.count_fenced(relay, &report);
        }
        if !self.releases.is_empty() {
            let releases = std::mem::take(&mut self.releases);
            let report = with_retries(|| ctx.store.release(&releases)).await?;
            self.report.released += report.applied as u64;
            metrics::count(metrics::RELEASED, relay, report.applied as u64);
            self.count_fenced(relay, &report);
        }
        Ok(())
    }

    fn count_fenced(&mut self, relay: &super::RelayConfig, report: &SettleReport) {
        if !report.fenced.is_empty() {
            tracing::warn!(relay = %relay.relay_id, fenced = report.fenced.len(), "settlement fenced off: another relay re-claimed these events after our lease expired");
            self.report.fenced += report.fenced.len() as u64;
            metrics::count(metrics::FENCED, relay, report.fenced.len() as u64);
        }
    }
}

/// Retries a settlement a few times on retryable store errors: the lease is
/// still ours, and giving up means the events are published again later.
async fn with_retries<F, Fut>(mut call: F) -> Result<SettleReport, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<SettleReport, StoreError>>,
{
    let mut delay = Duration::from_millis(50);
    for _ in 0..3 {
        match call().await {
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "settlement failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 4;
            }
            other => return other,
        }
    }
    call().await
}
