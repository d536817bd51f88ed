//! The relay loop: claim → publish (outside any transaction) → settle,
//! pipelined, with an outage circuit and graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::alert::{AlertHook, FailedAlert, FailureCause, LogAlert};
use super::batch::{BatchEnd, BatchWork};
use super::config::{ConfigError, RelayConfig};
use super::health::RelayHealth;
use super::metrics;
use super::pace::{BatchDone, FullSpeed, Pace};
use super::prefetch::PrefetchGate;
use super::report::{RelayError, RelayReport};
use super::wake_up::{PollOnly, WakeUp};
use crate::error::StoreError;
use crate::policy::{PoisonPolicy, RandomSource, SplitMix64};
use crate::publisher::Publisher;
use crate::store::{ClaimRequest, ClaimedBatch, Heartbeat, OutboxStore, PublisherOutage, Release};

/// What every step of the loop reads.
pub(super) struct RelayContext<S: ?Sized, P: ?Sized> {
    pub(super) config: RelayConfig,
    pub(super) alert: Arc<dyn AlertHook>,
    pub(super) random: Arc<dyn RandomSource>,
    pub(super) store: Arc<S>,
    pub(super) publisher: Arc<P>,
}

/// Moves committed events from a store to a broker.
///
/// Run as many relays as you like over one store: leases keep them off each
/// other's events and per-key ordering holds across all of them.
pub struct Relay<S: ?Sized, P: ?Sized> {
    ctx: RelayContext<S, P>,
    wake_up: Box<dyn WakeUp>,
    pace: Box<dyn Pace>,
    health: RelayHealth,
}

struct Claimed {
    batch: ClaimedBatch,
    started: Instant,
}

impl<S, P> Relay<S, P>
where
    S: OutboxStore + ?Sized + 'static,
    P: Publisher + ?Sized + 'static,
{
    /// A relay over `store` and `publisher`; fails on settings that cannot work.
    pub fn new(store: Arc<S>, publisher: Arc<P>, config: RelayConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            ctx: RelayContext {
                config,
                alert: Arc::new(LogAlert),
                random: Arc::new(SplitMix64::from_entropy()),
                store,
                publisher,
            },
            wake_up: Box::new(PollOnly),
            pace: Box::new(FullSpeed),
            health: RelayHealth::default(),
        })
    }

    /// A handle on this relay's state (is it paused by an outage, since
    /// when), for a health endpoint in the same process: take it before
    /// [`Relay::run`].
    pub fn health(&self) -> RelayHealth {
        self.health.clone()
    }

    /// Ends idle waits early on hints from `wake_up`.
    pub fn with_wake_up(mut self, wake_up: impl WakeUp + 'static) -> Self {
        self.wake_up = Box::new(wake_up);
        self
    }

    /// Rests between batches as `pace` says (default: never; a
    /// [`TenantFleet`](crate::tenants::TenantFleet) sets its fair share).
    pub fn with_pace(mut self, pace: impl Pace + 'static) -> Self {
        self.pace = Box::new(pace);
        self
    }

    /// Called for every event moved to `failed` (default: log it).
    pub fn with_alert_hook(mut self, alert: impl AlertHook + 'static) -> Self {
        self.ctx.alert = Arc::new(alert);
        self
    }

    /// Replaces the jitter source (tests pin it).
    pub fn with_random(mut self, random: impl RandomSource + 'static) -> Self {
        self.ctx.random = Arc::new(random);
        self
    }

    /// The settings in force.
    pub fn config(&self) -> &RelayConfig {
        &self.ctx.config
    }

    /// Runs on a new task until `shutdown` is cancelled and the relay
    /// drained, or until a store error that retrying cannot cure.
    pub fn spawn(
        self,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<Result<RelayReport, RelayError>> {
        tokio::spawn(self.run(shutdown))
    }

    /// Runs until `shutdown` is cancelled: stops claiming, lets the batch in
    /// flight finish for up to `drain_timeout`, then releases what is left.
    ///
    /// Retryable store errors (connection lost, pool timeout, conflicts) are
    /// backed off from for as long as they last, counted in the report and
    /// the `outbox_relay_store_errors_total` metric. A store error retrying
    /// cannot cure (tables never migrated, the wrong database, permission
    /// denied) ends the relay at once with [`RelayError`]: a relay that
    /// cannot work must not look alive.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<RelayReport, RelayError> {
        let span = tracing::info_span!("outbox_relay", relay = %self.ctx.config.relay_id);
        async move {
            let mut report = RelayReport {
                drained: true,
                ..RelayReport::default()
            };
            let mut next: Option<Claimed> = None;
            let mut consecutive_outages = 0u32;
            let mut consecutive_store_errors = 0u32;
            let mut prefetch_gate = PrefetchGate::new(self.ctx.config.prefetch);
            let mut last_heartbeat: Option<Instant> = None;
            let destination = self.ctx.publisher.destination();
            // Present at 0 from the start: an alert or a rate needs a
            // series before the first outage or event.
            metrics::start(&self.ctx.config);
            metrics::publisher_outage(&destination, false);
            metrics::paused(&self.ctx.config, false);
            loop {
                if shutdown.is_cancelled() {
                    break;
                }
                self.heartbeat_if_due(&mut last_heartbeat).await;
                let was_prefetched = next.is_some();
                let claimed = match next.take() {
                    Some(claimed) => claimed,
                    None => match self.claim().await {
                        Ok(claimed) => claimed,
                        Err(error) => {
                            report.store_errors += 1;
                            consecutive_store_errors += 1;
                            metrics::count(metrics::STORE_ERRORS, &self.ctx.config, 1);
                            if !error.is_retryable() {
                                tracing::error!(%error, "claim failed and retrying cannot help; relay stopped");
                                return Err(RelayError { error, report });
                            }
                            tracing::warn!(%error, "claim failed; backing off");
                            let pause = self.ctx.config.outage.pause(consecutive_store_errors, self.ctx.random.as_ref());
                            pause_or_shutdown(pause, &shutdown).await;
                            continue;
                        }
                    },
                };
                consecutive_store_errors = 0;
                self.alert_crash_loops(&claimed.batch);
                report.failed +=
                    (claimed.batch.crash_looped.len() + claimed.batch.unreadable.len()) as u64;
                if was_prefetched {
                    prefetch_gate.prefetched(!claimed.batch.events.is_empty());
                }
                if claimed.batch.events.is_empty() {
                    // A claim made while the previous batch was in flight
                    // finds nothing when every key with pending events was
                    // in that batch (few keys, one hot key): that is work
                    // behind our own leases, not an idle store. Claim again
                    // now that the batch is settled.
                    if !was_prefetched {
                        self.idle(&shutdown).await;
                    }
                    continue;
                }
                let claimed_events = claimed.batch.events.len();
                let full = claimed_events >= self.ctx.config.batch_size;
                let batch_started = Instant::now();
                let prefetch = prefetch_gate.should_prefetch(full);
                let mut work = BatchWork::new(claimed.batch.events, claimed.started, self.ctx.config.lease_duration);
                let (end, prefetched, drained) = {
                    let ctx = &self.ctx;
                    let step = async {
                        if prefetch {
                            let (end, next) = tokio::join!(work.run(ctx), claim_with(ctx));
                            (end, next.ok())
                        } else {
                            (work.run(ctx).await, None)
                        }
                    };
                    tokio::pin!(step);
                    tokio::select! {
                        done = &mut step => (Some(done.0), done.1, true),
                        _ = shutdown.cancelled() => {
                            match tokio::time::timeout(ctx.config.drain_timeout, &mut step).await {
                                Ok(done) => (Some(done.0), done.1, true),
                                Err(_) => (None, None, false),
                            }
                        }
                    }
                };
                if !drained {
                    // The batch overran the drain timeout: write what was
                    // decided, release the rest (started attempts still count
                    // towards crash-loop detection).
                    tracing::warn!("drain timeout reached; releasing leases of the batch in flight");
                    if let Err(error) = work.settle(&self.ctx).await {
                        tracing::error!(%error, "could not release leases at shutdown; they will expire");
                    }
                    report.drained = false;
                }
                merge(&mut report, &work.report);
                next = prefetched;
                match end {
                    Some(Ok(BatchEnd::Completed)) => {
                        if self.health.outage_over() {
                            tracing::info!(%destination, "broker reachable again; relay resumed");
                            metrics::paused(&self.ctx.config, false);
                            metrics::publisher_outage(&destination, false);
                            // Say so at once: status and health read it.
                            last_heartbeat = None;
                        }
                        consecutive_outages = 0;
                        let rest = self.pace.rest_after(&BatchDone {
                            events: claimed_events,
                            full,
                            busy: batch_started.elapsed(),
                        });
                        if !rest.is_zero() {
                            metrics::rested(&self.ctx.config, rest);
                            pause_or_shutdown(rest, &shutdown).await;
                        }
                    }
                    Some(Ok(BatchEnd::Outage(message))) => {
                        consecutive_outages += 1;
                        report.outages += 1;
                        metrics::count(metrics::OUTAGES, &self.ctx.config, 1);
                        metrics::paused(&self.ctx.config, true);
                        metrics::publisher_outage(&destination, true);
                        self.health.outage_seen(PublisherOutage::new(destination.clone(), message.clone()));
                        if let Some(prefetched) = next.take() {
                            self.release_unstarted(prefetched, &mut report).await;
                        }
                        let pause = self.ctx.config.outage.pause(consecutive_outages, self.ctx.random.as_ref());
                        tracing::warn!(%destination, error = %message, ?pause, "broker outage; relay paused, no attempts burned");
                        // Recorded at once (the latest reason each time),
                        // and beating on through the pause: a paused relay
                        // is alive.
                        last_heartbeat = None;
                        self.pause_beating(pause, &shutdown, &mut last_heartbeat).await;
                    }
                    Some(Err(error)) => {
                        report.store_errors += 1;
                        metrics::count(metrics::STORE_ERRORS, &self.ctx.config, 1);
                        if !error.is_retryable() {
                            // Claiming again would publish the same events
                            // again, forever: stop and say why.
                            tracing::error!(%error, "settling a batch failed and retrying cannot help; relay stopped");
                            if let Some(prefetched) = next.take() {
                                self.release_unstarted(prefetched, &mut report).await;
                            }
                            return Err(RelayError { error, report });
                        }
                        tracing::warn!(%error, "settling a batch failed; its leases will expire and the events be published again");
                    }
                    None => break,
                }
            }
            if let Some(prefetched) = next.take() {
                self.release_unstarted(prefetched, &mut report).await;
            }
            tracing::info!(?report, "relay stopped");
            Ok(report)
        }
        .instrument(span)
        .await
    }

    async fn claim(&self) -> Result<Claimed, StoreError> {
        claim_with(&self.ctx).await
    }

    async fn idle(&mut self, shutdown: &CancellationToken) {
        tokio::select! {
            _ = tokio::time::sleep(self.ctx.config.poll_interval) => {}
            _ = self.wake_up.wait() => {}
            _ = shutdown.cancelled() => {}
        }
    }

    async fn heartbeat_if_due(&self, last: &mut Option<Instant>) {
        let due = last.is_none_or(|at| at.elapsed() >= self.ctx.config.heartbeat_interval);
        if due {
            *last = Some(Instant::now());
            let beat = Heartbeat {
                relay: self.ctx.config.relay_id.clone(),
                outage: self.health.outage().map(|o| o.outage),
            };
            if let Err(error) = self.ctx.store.heartbeat(&beat).await {
                tracing::warn!(%error, "heartbeat failed");
            }
        }
    }

    /// Sleeps `pause` (or until shutdown), heartbeating as due meanwhile.
    async fn pause_beating(
        &self,
        pause: Duration,
        shutdown: &CancellationToken,
        last_heartbeat: &mut Option<Instant>,
    ) {
        let until = Instant::now() + pause;
        loop {
            self.heartbeat_if_due(last_heartbeat).await;
            let now = Instant::now();
            if now >= until || shutdown.is_cancelled() {
                return;
            }
            let step = (until - now).min(self.ctx.config.heartbeat_interval);
            pause_or_shutdown(step, shutdown).await;
        }
    }

    fn alert_crash_loops(&self, batch: &ClaimedBatch) {
        for event in &batch.crash_looped {
            metrics::count_failed(&self.ctx.config, "crash_loop");
            self.ctx.alert.event_failed(&FailedAlert {
                event: event.clone(),
                cause: FailureCause::CrashLoop,
                error: "publish attempts kept starting and never finished".into(),
                key_blocked: self.ctx.config.poison == PoisonPolicy::Block,
            });
        }
        for unreadable in &batch.unreadable {
            metrics::count_failed(&self.ctx.config, "unreadable");
            self.ctx.alert.event_failed(&FailedAlert {
                event: unreadable.event.clone(),
                cause: FailureCause::Unreadable,
                error: unreadable.reason.clone(),
                key_blocked: self.ctx.config.poison == PoisonPolicy::Block,
            });
        }
    }

    async fn release_unstarted(&self, claimed: Claimed, report: &mut RelayReport) {
        let releases: Vec<Release> = claimed
            .batch
            .events
            .into_iter()
            .map(|e| Release {
                lease: e.lease,
                attempt_started: false,
            })
            .collect();
        match self.ctx.store.release(&releases).await {
            Ok(r) => {
                report.released += r.applied as u64;
                metrics::count(metrics::RELEASED, &self.ctx.config, r.applied as u64);
            }
            Err(error) => {
                tracing::warn!(%error, "could not release prefetched leases; they will expire")
            }
        }
    }
}

async fn claim_with<S, P>(ctx: &RelayContext<S, P>) -> Result<Claimed, StoreError>
where
    S: OutboxStore + ?Sized,
    P: ?Sized,
{
    let request = ClaimRequest {
        owner: ctx.config.relay_id.clone(),
        limit: ctx.config.batch_size,
        lease_duration: ctx.config.lease_duration,
        ordering: ctx.config.ordering,
        poison: ctx.config.poison,
        crash_loop_limit: ctx.config.crash_loop_limit,
    };
    let started = Instant::now();
    let batch = ctx.store.claim_batch(&request).await?;
    metrics::seconds(metrics::CLAIM_SECONDS, &ctx.config, started.elapsed());
    if !batch.events.is_empty() {
        metrics::batch_size(&ctx.config, batch.events.len());
    }
    Ok(Claimed { batch, started })
}

async fn pause_or_shutdown(pause: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(pause) => {}
        _ = shutdown.cancelled() => {}
    }
}

fn merge(total: &mut RelayReport, batch: &RelayReport) {
    total.published += batch.published;
    total.retried += batch.retried;
    total.failed += batch.failed;
    total.fenced += batch.fenced;
    total.released += batch.released;
}
