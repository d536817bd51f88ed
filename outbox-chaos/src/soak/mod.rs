//! The soak run: hours of production compressed into minutes, watched for
//! what accumulates. A private PostgreSQL and Redis; producers over Zipf
//! keys with periodic bursts on one hot key; four relay processes killed,
//! paused past their lease and redeployed (each calling `migrate()` at
//! start); the broker killed and restarted; a transaction holding the
//! server's xmin for a long stretch; published events purged on a short
//! schedule; `status` (stats, held back, blocked keys) and a probe claim
//! timed all along. It fails on a loss, a double application, an order
//! violation, an attempt burned or an event failed (no event here is
//! poison), a retained history that outgrows the retention window, a
//! `status` slower than its bound, a claim that costs more as the run goes
//! on, and other keys' publication held back while a hot key drains (their
//! p99 both above twice the quiet p99 plus 250 ms and above half the hot
//! key's own: waiting on its backlog, not the two cores' noise). Both
//! latencies are taken outside fault windows (a kill's or a pause's lease
//! lapse, a deploy, a broker restart, each with what it leaves behind):
//! bursts wait for calm and faults wait for a burst to drain, so the check
//! always has both sides to compare, and fails if it has not.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_core::policy::{RandomSource, SplitMix64};
use outbox_core::store::{ClaimRequest, OutboxAdmin, OutboxStore, RelayId, Release};
use outbox_core::{CancellationToken, EventId, NewEvent, Ordering, OutboxWriter, PoisonPolicy};
use outbox_sqlx::StoreConfig;
use outbox_sqlx::postgres::PgStore;
use redis::AsyncCommands;

use crate::Error;
use crate::cluster::{PrivatePg, PrivateRedis};
use crate::roles::{EFFECTS, EFFECTS_SCHEMA, GROUP, STREAM};
use crate::run::{Broker, Committed, Processes};
use outbox_sqlx::postgres::EffectLog;

/// The size and pace of a soak run.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    duration: Duration,
    keys: usize,
    rate: f64,
    burst_every: Duration,
    burst_events: usize,
    /// How long after a burst starts no fault may begin: the hot-key check
    /// compares the other keys' latency while the burst drains with their
    /// quiet latency, both outside fault windows.
    burst_calm: Duration,
    kill_every: Duration,
    pause_every: Duration,
    deploy_every: Duration,
    broker_restart_every: Duration,
    broker_down: Duration,
    xmin_held: Duration,
    retention: Duration,
    purge_every: Duration,
    probe_every: Duration,
    status_bound: Duration,
}

impl Settings {
    /// What a deploy or a broker restart leaves behind: a lease to lapse,
    /// the publisher's reconnect backoff and a few seconds of catching up.
    fn after_restart(&self) -> Duration {
        LEASE + self.broker_down + Duration::from_secs(5)
    }

    /// The CI size (about two minutes) unless `--full` (30 minutes);
    /// `--minutes N` sets the length.
    pub(crate) fn from_args(args: &[String]) -> Self {
        let mut settings = Self {
            duration: Duration::from_secs(120),
            keys: 1_000,
            rate: 150.0,
            burst_every: Duration::from_secs(40),
            burst_events: 3_000,
            burst_calm: Duration::from_secs(8),
            kill_every: Duration::from_secs(9),
            pause_every: Duration::from_secs(33),
            deploy_every: Duration::from_secs(50),
            broker_restart_every: Duration::from_secs(45),
            broker_down: Duration::from_secs(3),
            xmin_held: Duration::from_secs(40),
            retention: Duration::from_secs(20),
            purge_every: Duration::from_secs(10),
            probe_every: Duration::from_secs(5),
            status_bound: Duration::from_secs(1),
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--full" => {
                    settings.duration = Duration::from_secs(30 * 60);
                    settings.rate = 300.0;
                    settings.burst_every = Duration::from_secs(180);
                    settings.burst_events = 20_000;
                    settings.burst_calm = Duration::from_secs(30);
                    settings.kill_every = Duration::from_secs(7);
                    settings.pause_every = Duration::from_secs(60);
                    settings.deploy_every = Duration::from_secs(240);
                    settings.broker_restart_every = Duration::from_secs(300);
                    settings.broker_down = Duration::from_secs(5);
                    settings.xmin_held = Duration::from_secs(300);
                    settings.retention = Duration::from_secs(120);
                    settings.purge_every = Duration::from_secs(60);
                    settings.probe_every = Duration::from_secs(15);
                }
                "--minutes" => {
                    let minutes: u64 = args
                        .next()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| panic!("--minutes needs a number"));
                    settings.duration = Duration::from_secs(minutes * 60);
                }
                other => panic!("unknown argument {other}"),
            }
        }
        settings
    }
}

/// One committed event: its key, when its transaction committed (ms since
/// the epoch), and whether it was part of a hot-key burst.
struct Sent {
    key: String,
    committed_ms: u128,
    hot: bool,
}

/// What the run observed along the way.
#[derive(Default)]
struct Observed {
    sent: HashMap<EventId, Sent>,
    bursts: Vec<(u128, u128)>,
    /// Windows (ms since the epoch) in which a commit or a publication
    /// counts as under a fault: the fault itself, half a second before it
    /// and what it leaves behind after.
    faults: Vec<(u128, u128)>,
    /// Faults begun and not yet over.
    faults_under_way: u32,
    /// No fault begins before this (ms since the epoch): a burst drains.
    calm_until: u128,
    /// When the report held xmin, `(from, to)` (ms since the epoch).
    xmin_held: Option<(u128, u128)>,
    /// When traffic began (ms since the epoch).
    traffic_from: u128,
    status_ms: Vec<f64>,
    claim_ms: Vec<(Duration, f64)>,
    purged: u64,
    kills: u64,
    pauses: u64,
    deploys: u64,
    broker_restarts: u64,
}

impl Observed {
    /// Whether a fault may begin now (no burst is draining); if so it is
    /// under way until [`Observed::fault`] records it.
    fn begin_fault(&mut self) -> bool {
        let free = now_ms() >= self.calm_until;
        if free {
            self.faults_under_way += 1;
        }
        free
    }

    /// The fault begun at `from` (ms since the epoch) is over; its effects
    /// last `after` beyond it.
    fn fault(&mut self, from: u128, after: Duration) {
        self.faults_under_way -= 1;
        self.faults
            .push((from.saturating_sub(500), now_ms() + after.as_millis()));
    }

    /// Whether a burst may begin now: no fault under way or leaving its
    /// effects; if so, no fault begins for `calm`.
    fn begin_burst(&mut self, calm: Duration) -> bool {
        let now = now_ms();
        let free = self.faults_under_way == 0 && self.faults.iter().all(|(_, to)| *to < now);
        if free {
            self.calm_until = now + calm.as_millis();
        }
        free
    }
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

const HOT_KEY: &str = "hot";
/// The relays' lease (roles::relay): a pause longer than it makes the
/// relay's batch come back through another relay.
const LEASE: Duration = Duration::from_secs(3);

pub(crate) async fn run(settings: Settings) -> Result<(), Error> {
    let started = Instant::now();
    let pg = PrivatePg::start(&["max_connections = 100"]);
    pg.psql("postgres", "CREATE DATABASE soak");
    let url = pg.url("soak");
    let redis = PrivateRedis::start();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await?;
    let store = Arc::new(PgStore::new(pool.clone(), StoreConfig::default()));
    store.migrate().await?;
    EffectLog::create(&pool, EFFECTS_SCHEMA).await?;
    println!(
        "# outbox-chaos soak: {:?} at {}/s over {} Zipf keys, a {}-event burst on one key every {:?}; \
         a relay SIGKILLed every {:?}, one paused past its lease every {:?}, all redeployed every {:?}; \
         Redis down {:?} every {:?}; xmin held {:?}; purge every {:?} keeping {:?}",
        settings.duration,
        settings.rate,
        settings.keys,
        settings.burst_events,
        settings.burst_every,
        settings.kill_every,
        settings.pause_every,
        settings.deploy_every,
        settings.broker_down,
        settings.broker_restart_every,
        settings.xmin_held,
        settings.purge_every,
        settings.retention
    );
    let broker_url = redis.url();
    let mut broker = Broker::Redis(redis);
    let mut processes = Processes::start(&url, &broker_url, 4);

    let observed = Arc::new(Mutex::new(Observed {
        traffic_from: now_ms(),
        ..Observed::default()
    }));
    let committed = Arc::new(Mutex::new(Committed::default()));
    let done = CancellationToken::new();
    let producer = tokio::spawn(produce(
        store.clone(),
        settings.clone(),
        committed.clone(),
        observed.clone(),
        done.clone(),
    ));
    let faults = tokio::spawn(relay_faults(
        processes.relays.clone(),
        settings.clone(),
        observed.clone(),
        done.clone(),
    ));
    let holder = hold_xmin(
        url.clone(),
        settings.clone(),
        observed.clone(),
        done.clone(),
    );
    let purger = tokio::spawn(purge(
        store.clone(),
        settings.clone(),
        observed.clone(),
        done.clone(),
    ));
    let prober = tokio::spawn(probe(
        store.clone(),
        settings.clone(),
        observed.clone(),
        done.clone(),
    ));

    // The broker restarts, on the orchestrator's own clock.
    let mut next_restart = started + settings.broker_restart_every;
    while started.elapsed() < settings.duration {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if Instant::now() >= next_restart && observed.lock().expect("observed").begin_fault() {
            let from = now_ms();
            broker.stop();
            tokio::time::sleep(settings.broker_down).await;
            broker.resume();
            let mut observed = observed.lock().expect("observed");
            observed.fault(from, settings.after_restart());
            observed.broker_restarts += 1;
            next_restart += settings.broker_restart_every;
        }
    }
    done.cancel();
    producer.await??;
    faults.await?;
    holder.await??;
    prober.await??;
    purger.await??;
    println!(
        "  .. {:>6.1} s  producing and faults over",
        started.elapsed().as_secs_f64()
    );

    // Drain: every committed event applied.
    let total = committed.lock().expect("committed").total;
    let drain_started = Instant::now();
    let mut next_report = drain_started + Duration::from_secs(30);
    let drained = tokio::time::timeout(Duration::from_secs(300), async {
        // Read on from the last effect seen (a count over every effect,
        // four times a second, took a core of its own by the end of the
        // full run). One consumer commits its effects in `seq` order.
        let mut seen = std::collections::HashSet::new();
        let mut last_seq = 0i64;
        loop {
            let fresh: Vec<(i64, uuid::Uuid)> = sqlx::query_as(&format!(
                "SELECT seq, event_id FROM {EFFECTS} WHERE seq > $1 ORDER BY seq"
            ))
            .bind(last_seq)
            .fetch_all(&pool)
            .await
            .unwrap_or_default();
            last_seq = fresh.last().map_or(last_seq, |(seq, _)| *seq);
            seen.extend(fresh.into_iter().map(|(_, id)| id));
            let applied = seen.len();
            if applied >= total {
                return;
            }
            if Instant::now() >= next_report {
                next_report += Duration::from_secs(30);
                println!(
                    "  .. {:>6.1} s  draining: {applied} of {total} applied; {}",
                    started.elapsed().as_secs_f64(),
                    drain_progress(&store, &broker_url).await
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    let drain_time = drain_started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The retention window, once more, over what is left.
    tokio::time::sleep(settings.retention).await;
    let mut purged_at_end = 0;
    loop {
        let n = store.purge_published(settings.retention, 1_000).await?;
        purged_at_end += n;
        if n < 1_000 {
            break;
        }
    }
    let stale: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_events WHERE created_at < now() - $1 * interval '1 millisecond'",
    )
    .bind((settings.retention + settings.purge_every + Duration::from_secs(5)).as_millis() as i64)
    .fetch_one(&pool)
    .await?;
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_attempts")
        .fetch_one(&pool)
        .await?;

    let (committed, report) = processes
        .kill_and_account(&committed, (&pool, &store), &mut broker)
        .await?;
    let published_at = first_publications(&broker_url).await?;
    let observed = std::mem::take(&mut *observed.lock().expect("observed"));
    let mut latency = Latency::of(&observed, &published_at);

    let status_max = observed.status_ms.iter().copied().fold(0.0, f64::max);
    let (claim_early, claim_late) = claim_trend(&observed.claim_ms);
    let purged = observed.purged + purged_at_end;

    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| run | {:.0} s of traffic, {:.0} s in all |",
        settings.duration.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "| events committed (hot-key bursts among them) | {} ({}) |",
        committed.total,
        observed.sent.values().filter(|s| s.hot).count()
    );
    report.print_delivery_rows();
    println!("| attempts recorded (an outage or a pause burning one) | {attempts} |");
    println!(
        "| relays SIGKILLed / paused past their lease / redeployed | {} / {} / {} |",
        observed.kills, observed.pauses, observed.deploys
    );
    println!("| Redis restarts | {} |", observed.broker_restarts);
    println!("| published events purged | {purged} |");
    println!("| rows older than retention + a purge interval, at the end | {stale} |");
    println!(
        "| status (stats + held back + blocked keys), slowest of {} | {status_max:.1} ms |",
        observed.status_ms.len()
    );
    println!(
        "| probe claim, median first third / last third of the run | {claim_early:.1} ms / {claim_late:.1} ms |"
    );
    print_fairness(
        "other keys",
        "a hot key",
        latency.quiet,
        latency.bursting,
        latency.hot_p99,
    );
    latency.print_quiet_split();
    println!(
        "| drain after the last commit | {:.1} s{} |",
        drain_time.as_secs_f64(),
        if drained.is_err() { " (gave up)" } else { "" }
    );

    let mut broken = Vec::new();
    if report.lost > 0
        || report.applied_twice > 0
        || report.order_violations > 0
        || drained.is_err()
    {
        broken.push("an event was lost, applied twice or out of order".to_owned());
    }
    if report.failed_or_parked > 0 {
        broken.push("an event failed although none is poison".to_owned());
    }
    if attempts > 0 {
        broken.push(format!(
            "{attempts} attempts burned (outages and pauses must burn none)"
        ));
    }
    if stale > 0 {
        broken.push(format!("{stale} rows outlived the retention window"));
    }
    if status_max > settings.status_bound.as_secs_f64() * 1_000.0 {
        broken.push(format!("status took {status_max:.0} ms"));
    }
    if claim_late > 2.0 * claim_early + 5.0 {
        broken.push(format!(
            "a claim went from {claim_early:.1} to {claim_late:.1} ms"
        ));
    }
    // Held back means waiting on the hot key's backlog: about as long as
    // the burst takes to drain (the bug this guards against made other
    // keys wait the whole drain). Slower than quiet alone is the two
    // cores' noise under a burst (a p99 of a few hundred samples), so both
    // must hold to fail. Kills, pauses, deploys and broker restarts each
    // leave their window out.
    broken.extend(watch::held_back(
        latency.quiet,
        latency.bursting,
        latency.hot_p99 / 2.0,
        "other keys, outside fault windows,",
        "a hot key",
    ));
    if broken.is_empty() {
        println!("\nsoak: nothing lost or applied twice, nothing grew, nothing slowed");
        Ok(())
    } else {
        Err(format!("soak: {}", broken.join("; ")).into())
    }
}

mod faults;
mod traffic;
mod watch;

use faults::*;
use traffic::*;

pub(crate) use traffic::{Zipf, burst_transactions, enqueue_retrying, pace};
use watch::*;
pub(crate) use watch::{
    SentEvent, drained_bursts, first_publications, held_back, percentiles, print_fairness,
    published_latencies, within,
};
