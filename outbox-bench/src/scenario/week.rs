//! A week in production on PostgreSQL, measured rather than asserted:
//! `status` (stats, held back, blocked keys: what every `/metrics` scrape
//! and `health` read) over a retained history of 1,000,000 published
//! events, with the planner's statistics from when the table was empty
//! (stale) and fresh; `status` beside 10,000 keys blocked by a failed event
//! (an event parked behind each) and 1,000 waiting; the time 200 keys take to come back after the relay
//! holding them dies (a lease of 10 s); a claim's cost after ten minutes
//! of 1,000 events/s while another application's transaction holds the
//! server's xmin back, against ten minutes with none; and what the purge
//! deletes per second of its own while producers commit 1,000 events/s
//! and a relay publishes them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use outbox_core::store::{ClaimRequest, OutboxAdmin, OutboxStore, RelayId};
use outbox_core::{CancellationToken, NewEvent, Ordering, PoisonPolicy, Relay, RelayConfig};
use outbox_sqlx::postgres::PgStore;
use sqlx::Executor;

use super::{Rounds, Scale, progress};
use crate::counting::CountingPublisher;
use crate::env::{self, Error};
use crate::open_loop::open_loop;
use crate::relay_run;
use crate::report::{Report, TargetCheck};
use crate::stats::percentiles;

/// Scenario name.
pub const NAME: &str = "week-postgres";
/// `status` reads per measurement.
const STATUS_READS: usize = 5;
/// Keys held by the relay that dies.
const DEAD_KEYS: usize = 200;
/// Events per second the producers offer while the purge runs.
const RATE: u64 = 1_000;
/// Keys blocked beside the backlog in `status-blocked-keys`.
const BLOCKED_KEYS: usize = 10_000;

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let retained = scale.pick(1_000_000, 20_000);
    let lease = Duration::from_secs(scale.pick(10, 2) as u64);
    let purge_seconds = scale.pick(20, 3) as u64;
    let xmin_seconds = scale.pick(600, 4) as u64;
    let pool = env::pg_pool(16).await?;
    let store = Arc::new(env::pg_store(&pool).await?);
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        if scale.includes("status-stale-stats") || scale.includes("status-fresh-stats") {
            let (stale, fresh) = status_over_history(&store, round, retained).await?;
            rounds.add("status-stale-stats", "slowest ms", stale, false);
            rounds.add("status-fresh-stats", "slowest ms", fresh, false);
            progress(format!(
                "round {round} status over {retained} retained: slowest {stale:.1} ms with stale statistics, {fresh:.1} ms fresh"
            ));
        }
        if scale.includes("status-blocked-keys") {
            let backlog = scale.pick(1_000, 200);
            let keys = scale.pick(BLOCKED_KEYS, 200);
            let slowest = status_beside_blocked_keys(&store, round, keys, backlog).await?;
            rounds.add("status-blocked-keys", "slowest ms", slowest, false);
            progress(format!(
                "round {round} status beside {keys} blocked keys and {backlog} waiting: slowest {slowest:.1} ms"
            ));
        }
        if scale.includes("resume-200-keys") {
            let resumed = resume_after_death(&store, round, lease).await?;
            rounds.add("resume-200-keys", "after lease s", resumed, false);
            progress(format!(
                "round {round} {DEAD_KEYS} keys of a dead relay back {resumed:.2} s after its {lease:?} lease"
            ));
        }
        // Ten minutes each at full size: one round.
        if round == 0 {
            for (contender, hold_xmin) in [("claims-no-xmin", false), ("claims-xmin-held", true)] {
                if !scale.includes(contender) {
                    continue;
                }
                let ms = claim_cost_over_time(&store, round, xmin_seconds, hold_xmin).await?;
                rounds.add(contender, "claim ms, last tenth", ms, false);
                progress(format!(
                    "round {round} {contender}: claim median {ms:.2} ms over the last tenth of {xmin_seconds} s"
                ));
            }
        }
        if scale.includes("purge-under-traffic") {
            let (rate, deleted) = purge_under_traffic(&store, round, purge_seconds).await?;
            rounds.add("purge-under-traffic", "deleted/s of purging", rate, true);
            progress(format!(
                "round {round} purge under {RATE} events/s: {deleted} deleted while producing, {rate:.0} per second of purging"
            ));
        }
    }
    rounds.finish(NAME, report);
    let worst =
        |report: &Report, c: &str, metric: &str| report.worst(NAME, c, metric).unwrap_or(f64::NAN);
    for (contender, label) in [
        ("status-stale-stats", "stale"),
        ("status-fresh-stats", "fresh"),
    ] {
        let slowest = worst(report, contender, "slowest ms");
        report.target(TargetCheck::at_most(
            format!("status ms over {retained} retained events, {label} statistics (worst round)"),
            slowest,
            200.0,
        ));
    }
    report.target(TargetCheck::at_most(
        format!(
            "status ms beside {} blocked keys and {} waiting (worst round)",
            scale.pick(BLOCKED_KEYS, 200),
            scale.pick(1_000, 200)
        ),
        worst(report, "status-blocked-keys", "slowest ms"),
        200.0,
    ));
    let resumed = worst(report, "resume-200-keys", "after lease s");
    report.target(TargetCheck::at_most(
        format!("{DEAD_KEYS} keys of a dead relay: s after its lease (worst round)"),
        resumed,
        2.0,
    ));
    let claims = |c: &str| {
        report
            .median(NAME, c, "claim ms, last tenth")
            .unwrap_or(f64::NAN)
    };
    let xmin_ratio = claims("claims-xmin-held") / claims("claims-no-xmin");
    report.target(TargetCheck::at_most(
        format!("claim after {xmin_seconds} s with xmin held / none"),
        xmin_ratio,
        1.2,
    ));
    let purged = report
        .median(NAME, "purge-under-traffic", "deleted/s of purging")
        .unwrap_or(f64::NAN);
    report.target(TargetCheck::at_least(
        format!("purge: deleted/s of purging while {RATE} events/s are produced"),
        purged,
        RATE as f64,
    ));
    pool.close().await;
    Ok(())
}

/// Fills `retained` events and publishes them, with the planner's
/// statistics taken while the table was empty and autovacuum off for it;
/// leaves 1,000 waiting; returns the slowest `status` with those stale
/// statistics, then with fresh ones.
async fn status_over_history(
    store: &Arc<PgStore>,
    round: usize,
    retained: usize,
) -> Result<(f64, f64), Error> {
    let pool = store.pool();
    env::pg_reset(pool).await?;
    pool.execute("ANALYZE bench_events; ALTER TABLE bench_events SET (autovacuum_enabled = false)")
        .await?;
    let filled = async {
        env::fill_writer(store.as_ref(), retained, |i| env::event(round, i)).await?;
        let publisher = Arc::new(CountingPublisher::noop(1_000));
        relay_run::drain(
            store.clone(),
            publisher,
            relay_run::config(1_000, Ordering::Unordered),
            1,
            retained as u64,
        )
        .await?;
        env::fill_writer(store.as_ref(), 1_000, |i| env::event(round, retained + i)).await?;
        let stale = slowest_status(store.as_ref()).await?;
        pool.execute("ANALYZE bench_events").await?;
        let fresh = slowest_status(store.as_ref()).await?;
        Ok::<_, Error>((stale, fresh))
    }
    .await;
    pool.execute("ALTER TABLE bench_events RESET (autovacuum_enabled)")
        .await?;
    filled
}

/// `keys` keys blocked by a failed event under `PoisonPolicy::Block`, an
/// event parked behind each, then a backlog of `backlog` events on other
/// keys; returns the slowest `status`. (Its blocked-keys read once hashed
/// the blocked keys again for every backlog row: 81 s beside a backlog of
/// 100,000.)
async fn status_beside_blocked_keys(
    store: &Arc<PgStore>,
    round: usize,
    keys: usize,
    backlog: usize,
) -> Result<f64, Error> {
    env::pg_reset(store.pool()).await?;
    let key = |i: usize| usize::MAX - i % keys;
    env::fill_writer(store.as_ref(), 2 * keys, |i| {
        env::event_for_key(round, backlog + i, key(i))
    })
    .await?;
    let heads = env::claim_heads(store.as_ref(), keys).await?;
    env::block_all(store.as_ref(), &heads).await?;
    env::fill_writer(store.as_ref(), backlog, |i| env::event(round, i)).await?;
    let blocked_keys = store.blocked_keys().await?;
    if blocked_keys.len() != keys {
        return Err(format!("status lists {} of {keys} blocked keys", blocked_keys.len()).into());
    }
    slowest_status(store.as_ref()).await
}

/// The slowest of [`STATUS_READS`] `status` reads (stats, held back,
/// blocked keys), in milliseconds.
async fn slowest_status(store: &PgStore) -> Result<f64, Error> {
    let mut times = Vec::with_capacity(STATUS_READS);
    for _ in 0..STATUS_READS {
        let started = Instant::now();
        store.stats().await?;
        store.held_back().await?;
        store.blocked_keys().await?;
        times.push(started.elapsed().as_secs_f64() * 1_000.0);
    }
    Ok(percentiles(&mut times, &[100.0])[0])
}

/// A relay claims two events on each of [`DEAD_KEYS`] keys and dies (it
/// never settles); another relay is already running. Returns how long
/// after the dead lease's expiry the last of them was published, in
/// seconds.
async fn resume_after_death(
    store: &Arc<PgStore>,
    round: usize,
    lease: Duration,
) -> Result<f64, Error> {
    env::pg_reset(store.pool()).await?;
    let events: Vec<NewEvent> = (0..2 * DEAD_KEYS)
        .map(|i| env::event_for_key(round, i, i % DEAD_KEYS))
        .collect();
    let mut tx = store.pool().begin().await?;
    store.enqueue(&mut tx, &events).await?;
    tx.commit().await?;
    let claimed_at = Instant::now();
    let dead = store
        .claim_batch(&ClaimRequest {
            owner: RelayId::new("bench-dead-relay"),
            limit: events.len(),
            lease_duration: lease,
            ordering: Ordering::PerKey,
            poison: PoisonPolicy::Skip,
            crash_loop_limit: 5,
        })
        .await?;
    if dead.events.len() != events.len() {
        return Err(format!(
            "the relay that dies claimed {} of {} events",
            dead.events.len(),
            events.len()
        )
        .into());
    }
    let relay = DefaultRelay::start(store).await?;
    let publisher = relay.publisher.clone();
    let reached = tokio::time::timeout(
        lease + Duration::from_secs(30),
        publisher.wait_for(events.len() as u64),
    )
    .await;
    let resumed = claimed_at.elapsed();
    relay.stop().await?;
    if reached.is_err() {
        return Err(format!(
            "{} of {} events of the dead relay came back",
            publisher.delivered(),
            events.len()
        )
        .into());
    }
    Ok(resumed.saturating_sub(lease).as_secs_f64())
}

/// Producers commit [`RATE`] events/s for `seconds` while a relay publishes
/// them and the purge runs every second (retention zero); returns the
/// events deleted per second spent in purge calls, and how many it deleted
/// while the producers ran.
async fn purge_under_traffic(
    store: &Arc<PgStore>,
    round: usize,
    seconds: u64,
) -> Result<(f64, u64), Error> {
    env::pg_reset(store.pool()).await?;
    let relay = DefaultRelay::start(store).await?;
    let publisher = relay.publisher.clone();
    let producing = Arc::new(AtomicBool::new(true));
    let purger = {
        let store = store.clone();
        let producing = producing.clone();
        tokio::spawn(async move {
            let (mut deleted, mut busy) = (0_u64, Duration::ZERO);
            while producing.load(AtomicOrdering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let started = Instant::now();
                loop {
                    let n = store.purge_published(Duration::ZERO, 1_000).await?;
                    deleted += n;
                    if n < 1_000 {
                        break;
                    }
                }
                busy += started.elapsed();
            }
            Ok::<_, Error>((deleted, busy))
        })
    };
    let total = produce(store, round, seconds).await?;
    producing.store(false, AtomicOrdering::SeqCst);
    let (deleted, busy) = purger.await??;
    let reached = tokio::time::timeout(Duration::from_secs(60), publisher.wait_for(total)).await;
    relay.stop().await?;
    if reached.is_err() {
        return Err(format!("only {} of {total} events delivered", publisher.delivered()).into());
    }
    if deleted == 0 {
        return Err("the purge deleted nothing while events were published".into());
    }
    Ok((deleted as f64 / busy.as_secs_f64(), deleted))
}

/// Commits [`RATE`] events/s for `seconds`, one per transaction, on
/// schedule whatever the commits take; returns how many.
async fn produce(store: &Arc<PgStore>, round: usize, seconds: u64) -> Result<u64, Error> {
    let total = RATE * seconds;
    open_loop(RATE, total, |i| {
        let store = store.clone();
        async move {
            let event = env::event(round, i as usize);
            let mut tx = store.pool().begin().await?;
            store.enqueue(&mut tx, std::slice::from_ref(&event)).await?;
            tx.commit().await?;
            Ok(())
        }
    })
    .await?;
    Ok(total)
}

/// Producers commit [`RATE`] events/s for `seconds` while a relay publishes
/// them, with another application's transaction holding the server's xmin
/// back the whole time (`hold_xmin`) or none; a probe, a second relay,
/// claims one event every 250 ms and acks it. Returns the probe claims'
/// median over the last tenth of the run, in milliseconds.
///
/// The probe acks rather than releases: a release writes the row out of
/// the stream (a tracked row), and the relay's ack writes it again, so a
/// releasing probe made four tracked-row writes a second of its own, and
/// with xmin held each left an index entry every later claim steps over.
/// That cost is a relay's nacks and releases under a held xmin (BENCHMARKS.md
/// says what it is); this row measures claims as relays make them.
async fn claim_cost_over_time(
    store: &Arc<PgStore>,
    round: usize,
    seconds: u64,
    hold_xmin: bool,
) -> Result<f64, Error> {
    env::pg_reset(store.pool()).await?;
    let stranger = if hold_xmin {
        Some(env::StrangerTransaction::open().await?)
    } else {
        None
    };
    let relay = DefaultRelay::start(store).await?;
    let publisher = relay.publisher.clone();
    let producing = Arc::new(AtomicBool::new(true));
    let prober = {
        let store = store.clone();
        let producing = producing.clone();
        tokio::spawn(async move {
            let request = ClaimRequest {
                owner: RelayId::new("bench-probe"),
                limit: 1,
                lease_duration: Duration::from_secs(30),
                ordering: Ordering::PerKey,
                poison: PoisonPolicy::Skip,
                crash_loop_limit: 5,
            };
            let started = Instant::now();
            let mut claims = Vec::new();
            let mut acked = 0u64;
            while producing.load(AtomicOrdering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let at = Instant::now();
                let batch = store.claim_batch(&request).await?;
                claims.push((started.elapsed(), at.elapsed().as_secs_f64() * 1_000.0));
                let leases: Vec<_> = batch.events.iter().map(|c| c.lease.clone()).collect();
                acked += store.ack(&leases).await?.applied as u64;
            }
            Ok::<_, Error>((started.elapsed(), claims, acked))
        })
    };
    let total = produce(store, round, seconds).await?;
    producing.store(false, AtomicOrdering::SeqCst);
    let (ran, claims, acked) = prober.await??;
    let reached =
        tokio::time::timeout(Duration::from_secs(60), publisher.wait_for(total - acked)).await;
    relay.stop().await?;
    if let Some(stranger) = stranger {
        stranger.end().await?;
    }
    if reached.is_err() {
        return Err(format!(
            "only {} of {} events delivered",
            publisher.delivered(),
            total - acked
        )
        .into());
    }
    let mut last: Vec<f64> = claims
        .iter()
        .filter(|(at, _)| *at >= ran.mul_f64(0.9))
        .map(|(_, ms)| *ms)
        .collect();
    if last.is_empty() {
        return Err("no probe claim in the run's last tenth".into());
    }
    Ok(percentiles(&mut last, &[50.0])[0])
}

/// One relay with the default settings and LISTEN/NOTIFY over `store`,
/// publishing to a no-op counting publisher.
struct DefaultRelay {
    publisher: Arc<CountingPublisher>,
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<Result<outbox_core::RelayReport, outbox_core::RelayError>>,
}

impl DefaultRelay {
    async fn start(store: &Arc<PgStore>) -> Result<Self, Error> {
        let publisher = Arc::new(CountingPublisher::noop(256));
        let relay = Relay::new(store.clone(), publisher.clone(), RelayConfig::default())?
            .with_wake_up(store.wake_up().await?);
        let shutdown = CancellationToken::new();
        let handle = relay.spawn(shutdown.clone());
        Ok(Self {
            publisher,
            shutdown,
            handle,
        })
    }

    /// Stops it gracefully.
    async fn stop(self) -> Result<(), Error> {
        self.shutdown.cancel();
        self.handle.await??;
        Ok(())
    }
}
