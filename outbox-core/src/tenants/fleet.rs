//! [`TenantFleet`]: one relay per tenant in one process, supervised.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use std::panic::AssertUnwindSafe;

use async_trait::async_trait;
use futures::FutureExt;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::share::{FairShare, ShareBoard};
use super::source::{TenantId, TenantSource};
use super::status::{FleetStatus, TenantState};
use crate::error::StoreError;
use crate::policy::{RandomSource, RetryPolicy, SplitMix64};
use crate::publisher::Publisher;
use crate::relay::{Relay, RelayError, RelayReport};
use crate::store::OutboxStore;

/// Builds one tenant's relay: its store (on the tenant's database or
/// schema, on a pool shared with the other tenants of its server, checked
/// ready), its publisher and its settings (give each tenant's relay an id
/// that names the tenant: it labels leases, heartbeats and metrics).
///
/// An error is that tenant's alone: it is reported in the fleet's status
/// and tried again after a backoff; the other tenants go on.
#[async_trait]
pub trait TenantRelayFactory: Send + Sync + 'static {
    /// The tenants' store type.
    type Store: OutboxStore + ?Sized + 'static;
    /// The tenants' publisher type.
    type Publisher: Publisher + ?Sized + 'static;

    /// The relay for `tenant`.
    async fn relay(
        &self,
        tenant: &TenantId,
    ) -> Result<Relay<Self::Store, Self::Publisher>, StoreError>;
}

/// How a fleet reads its tenants and retries the ones that fail.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// How often the tenant source is read again; a read slower than this
    /// counts as failed (the fleet keeps the tenants it had).
    pub refresh: Duration,
    /// The wait before a tenant whose relay could not start, or stopped on
    /// an error, is started again: its `initial_interval`, `multiplier`,
    /// `max_interval` and `jitter` (`max_attempts` is not used: a tenant is
    /// retried for as long as the source lists it).
    pub restart: RetryPolicy,
    /// How tenants draining a backlog leave room for the others.
    pub share: FairShare,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            refresh: Duration::from_secs(30),
            restart: RetryPolicy {
                initial_interval: Duration::from_secs(1),
                max_interval: Duration::from_secs(60),
                ..RetryPolicy::default()
            },
            share: FairShare::default(),
        }
    }
}

/// What a fleet's relays did, per tenant, over every start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetReport {
    /// Each tenant's relays' totals, restarts added up.
    pub tenants: BTreeMap<TenantId, RelayReport>,
    /// Starts that failed, and relays that stopped on an error.
    pub failures: u64,
}

/// Totals before any relay reported (`drained` until one did not).
fn no_report() -> RelayReport {
    RelayReport {
        drained: true,
        ..RelayReport::default()
    }
}

impl FleetReport {
    /// Every tenant's totals added up.
    pub fn total(&self) -> RelayReport {
        let mut total = no_report();
        for report in self.tenants.values() {
            total += report;
        }
        total
    }

    fn tenant(&mut self, tenant: &TenantId) -> &mut RelayReport {
        self.tenants.entry(tenant.clone()).or_insert_with(no_report)
    }
}

/// How one tenant's task ended.
enum Ended {
    /// Removed (or shut down) before its relay was built.
    Cancelled,
    /// The factory failed.
    NotStarted(StoreError),
    /// The relay ran and returned.
    Stopped(Result<RelayReport, RelayError>),
    /// The factory or the relay panicked.
    Panicked,
}

/// A tenant whose relay task runs.
struct Live {
    stop: CancellationToken,
    started: Instant,
    removed: bool,
}

/// A tenant waiting to be started again.
struct Waiting {
    at: Instant,
}

/// One relay per tenant, started and stopped as the source's list changes;
/// a tenant that fails is retried on its own. See the [module](super).
pub struct TenantFleet<F> {
    factory: Arc<F>,
    source: Arc<dyn TenantSource>,
    config: FleetConfig,
    status: FleetStatus,
    random: Arc<dyn RandomSource>,
    board: ShareBoard,
}

impl<F: TenantRelayFactory> TenantFleet<F> {
    /// A fleet over `source`'s tenants, each relay built by `factory`.
    pub fn new(source: impl TenantSource + 'static, factory: F, config: FleetConfig) -> Self {
        Self {
            board: ShareBoard::new(config.share.clone()),
            factory: Arc::new(factory),
            source: Arc::new(source),
            config,
            status: FleetStatus::default(),
            random: Arc::new(SplitMix64::from_entropy()),
        }
    }

    /// Replaces the jitter source of restart backoffs (tests pin it).
    pub fn with_random(mut self, random: impl RandomSource + 'static) -> Self {
        self.random = Arc::new(random);
        self
    }

    /// A handle on every tenant's state, for a health endpoint or `status`
    /// in the same process: take it before [`TenantFleet::run`].
    pub fn status(&self) -> FleetStatus {
        self.status.clone()
    }

    /// Runs until `shutdown` is cancelled, then stops every relay (each
    /// finishes its batch in flight, as [`Relay::run`] does) and returns
    /// what they did.
    pub async fn run(self, shutdown: CancellationToken) -> FleetReport {
        let mut run = FleetRun {
            fleet: &self,
            shutdown: shutdown.clone(),
            tasks: JoinSet::new(),
            live: BTreeMap::new(),
            waiting: BTreeMap::new(),
            failures: BTreeMap::new(),
            wanted: BTreeSet::new(),
            report: FleetReport::default(),
        };
        let mut refresh = tokio::time::interval(self.config.refresh);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next_retry = run.waiting.values().map(|w| w.at).min();
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = refresh.tick() => run.refresh().await,
                Some(joined) = run.tasks.join_next(), if !run.tasks.is_empty() => run.joined(joined),
                () = sleep_until(next_retry), if next_retry.is_some() => run.start_due(),
            }
        }
        for live in run.live.values() {
            live.stop.cancel();
        }
        while let Some(joined) = run.tasks.join_next().await {
            run.joined(joined);
        }
        run.report
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// The state of one [`TenantFleet::run`].
struct FleetRun<'a, F> {
    fleet: &'a TenantFleet<F>,
    shutdown: CancellationToken,
    tasks: JoinSet<(TenantId, Ended)>,
    live: BTreeMap<TenantId, Live>,
    waiting: BTreeMap<TenantId, Waiting>,
    /// Failures in a row, per tenant (reset by a relay that ran for the
    /// longest backoff before it stopped).
    failures: BTreeMap<TenantId, u32>,
    /// The source's tenants at its last good read.
    wanted: BTreeSet<TenantId>,
    report: FleetReport,
}

impl<F: TenantRelayFactory> FleetRun<'_, F> {
    /// Reads the source; stops removed tenants, starts new ones.
    async fn refresh(&mut self) {
        let read = tokio::time::timeout(self.fleet.config.refresh, self.fleet.source.tenants());
        match read.await {
            Ok(Ok(tenants)) => {
                self.fleet.status.set_source_error(None);
                self.wanted = tenants;
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "reading the tenants failed: keeping the last list");
                self.fleet.status.set_source_error(Some(error.to_string()));
            }
            Err(_) => {
                let error = format!(
                    "the tenant source did not answer within {:?}",
                    self.fleet.config.refresh
                );
                tracing::warn!(%error, "keeping the last list");
                self.fleet.status.set_source_error(Some(error));
            }
        }
        for (tenant, live) in &mut self.live {
            if !self.wanted.contains(tenant) && !live.removed {
                live.removed = true;
                live.stop.cancel();
                self.fleet.status.set(tenant, TenantState::Stopping);
            }
        }
        let removed: Vec<TenantId> = self
            .waiting
            .keys()
            .filter(|t| !self.wanted.contains(*t))
            .cloned()
            .collect();
        for tenant in removed {
            self.waiting.remove(&tenant);
            self.failures.remove(&tenant);
            self.fleet.status.forget(&tenant);
        }
        let new: Vec<TenantId> = self
            .wanted
            .iter()
            .filter(|t| !self.live.contains_key(*t) && !self.waiting.contains_key(*t))
            .cloned()
            .collect();
        for tenant in new {
            self.start(tenant);
        }
    }

    /// Starts the waiting tenants whose backoff has passed.
    fn start_due(&mut self) {
        let now = Instant::now();
        let due: Vec<TenantId> = self
            .waiting
            .iter()
            .filter(|(_, w)| w.at <= now)
            .map(|(t, _)| t.clone())
            .collect();
        for tenant in due {
            self.waiting.remove(&tenant);
            self.start(tenant);
        }
    }

    /// Builds and runs `tenant`'s relay on a task of its own: a factory
    /// that hangs (a database that does not answer) holds no one else.
    fn start(&mut self, tenant: TenantId) {
        let stop = self.shutdown.child_token();
        self.fleet.status.starting(&tenant);
        let (factory, status, token, pace) = (
            self.fleet.factory.clone(),
            self.fleet.status.clone(),
            stop.clone(),
            self.fleet.board.seat(),
        );
        let name = tenant.clone();
        let work = async move {
            let built = tokio::select! {
                built = factory.relay(&name) => built,
                () = token.cancelled() => return Ended::Cancelled,
            };
            let relay = match built {
                Ok(relay) => relay.with_pace(pace),
                Err(error) => return Ended::NotStarted(error),
            };
            status.set(&name, TenantState::Running);
            Ended::Stopped(relay.run(token).await)
        };
        let tenant_of_task = tenant.clone();
        self.tasks.spawn(async move {
            // A panic is this tenant's failure, retried like any other.
            let ended = AssertUnwindSafe(work)
                .catch_unwind()
                .await
                .unwrap_or(Ended::Panicked);
            (tenant_of_task, ended)
        });
        self.live.insert(
            tenant,
            Live {
                stop,
                started: Instant::now(),
                removed: false,
            },
        );
    }

    fn joined(&mut self, joined: Result<(TenantId, Ended), tokio::task::JoinError>) {
        match joined {
            Ok(ended) => self.ended(ended),
            // Panics are caught in the task; a task is aborted only when
            // the join set is dropped, which ends the run.
            Err(error) => tracing::error!(%error, "a tenant's relay task ended abnormally"),
        }
    }

    /// A tenant's task ended: forget it if it was removed, else start it
    /// again (after a backoff if it failed).
    fn ended(&mut self, (tenant, ended): (TenantId, Ended)) {
        let Some(live) = self.live.remove(&tenant) else {
            return;
        };
        let failure = match ended {
            Ended::Cancelled => None,
            Ended::NotStarted(error) => Some(error.to_string()),
            Ended::Stopped(Ok(report)) => {
                *self.report.tenant(&tenant) += &report;
                None
            }
            Ended::Stopped(Err(stopped)) => {
                *self.report.tenant(&tenant) += &stopped.report;
                Some(stopped.error.to_string())
            }
            Ended::Panicked => Some("its relay panicked".to_owned()),
        };
        if live.removed || self.shutdown.is_cancelled() || !self.wanted.contains(&tenant) {
            self.failures.remove(&tenant);
            self.fleet.status.forget(&tenant);
            return;
        }
        let Some(error) = failure else {
            // A relay returns only when asked to stop; if one did anyway,
            // it starts again at once.
            self.start(tenant);
            return;
        };
        self.report.failures += 1;
        let restart = &self.fleet.config.restart;
        let failures = self.failures.entry(tenant.clone()).or_default();
        if live.started.elapsed() >= restart.max_interval {
            *failures = 0;
        }
        *failures += 1;
        let wait = restart.backoff(*failures, self.fleet.random.as_ref());
        tracing::warn!(%tenant, %error, ?wait, "a tenant's relay failed: trying it again");
        self.fleet.status.set(
            &tenant,
            TenantState::Retrying {
                failures: *failures,
                error,
                retry_at: chrono::Duration::from_std(wait)
                    .ok()
                    .and_then(|wait| chrono::Utc::now().checked_add_signed(wait))
                    .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC),
            },
        );
        self.waiting.insert(
            tenant,
            Waiting {
                at: Instant::now() + wait,
            },
        );
    }
}
