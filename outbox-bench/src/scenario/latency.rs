//! Commit → publish latency on PostgreSQL under an open-loop producer of
//! 1,000 events/s (a business `UPDATE`, then one event, per transaction),
//! with LISTEN/NOTIFY, with LISTEN/NOTIFY while another application keeps a
//! write transaction open in another database, with a fifth of the
//! producers holding their transaction open 50–500 ms after the enqueue
//! (what that costs the others), during a rolling restart (three
//! application instances start one after another and each calls
//! `migrate()`, while a report holds the events table open the whole
//! round), and, for contrast, polling at the default interval, and PgQ
//! in the relay's place (`pgq.insert_event` in the same transaction; ticked
//! as `pgqd` does by default, and every 10 ms); and the
//! statements per second an idle relay sends. One second
//! of load before the first round warms the process up (not measured).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::{CancellationToken, EventId, Relay, RelayConfig};
use outbox_sqlx::postgres::PgStore;

use super::{Rounds, Scale, progress};
use crate::counting::CountingPublisher;
use crate::env::{self, Error};
use crate::report::{Report, TargetCheck};
use crate::stats::percentiles;
use crate::{pgq, query_count};

/// Scenario name.
pub const NAME: &str = "latency-postgres";
/// Events per second the producer offers.
const RATE: u64 = 1_000;
/// Invoices the producers update before they enqueue.
const INVOICES: u64 = 1_000;

/// How a round's producers and server behave.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// LISTEN/NOTIFY, producers commit at once.
    Notify,
    /// LISTEN/NOTIFY while a write transaction stays open in another database.
    Stranger,
    /// LISTEN/NOTIFY while every fifth producer holds its transaction open
    /// 50–500 ms after enqueueing.
    Held,
    /// LISTEN/NOTIFY while three instances start one after another, each
    /// calling `migrate()` on its own pool, beside a report holding the
    /// events table open.
    RollingMigrate,
    /// The default 1 s poll, no wake-up.
    Polling,
    /// PgQ instead of the relay, ticked as `pgqd` does by default (every
    /// second; a tick per 500 events or 3 s), its consumer asking for a
    /// batch every 10 ms while there is none.
    PgqDefault,
    /// PgQ ticked every 10 ms whenever anything is new.
    PgqTight,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Notify => "notify",
            Self::Stranger => "notify-stranger-open",
            Self::Held => "notify-held-producers",
            Self::RollingMigrate => "notify-rolling-migrate",
            Self::Polling => "polling-1s",
            Self::PgqDefault => "pgq-pgqd-default",
            Self::PgqTight => "pgq-ticker-10ms",
        }
    }

    /// For PgQ: the ticker's period and the queue's events per tick.
    fn pgq_ticker(self) -> Option<(Duration, usize)> {
        match self {
            Self::PgqDefault => Some((Duration::from_secs(1), 500)),
            Self::PgqTight => Some((Duration::from_millis(10), 1)),
            _ => None,
        }
    }

    /// Whether producer `i` holds its transaction open, and how long.
    fn hold(self, i: u64) -> Option<Duration> {
        (self == Self::Held && i % 5 == 0).then(|| Duration::from_millis(50 + (i * 37) % 451))
    }
}

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let seconds = scale.pick(15, 3) as u64;
    let idle_seconds = scale.pick(20, 4) as u64;
    // Enough connections for the producers a Held round keeps open.
    let pool = env::pg_pool(80).await?;
    let store = Arc::new(env::pg_store(&pool).await?);
    pgq::install(&pool).await?;
    sqlx::Executor::execute(
        &pool,
        &*format!(
            "CREATE TABLE IF NOT EXISTS bench_latency_invoices (id BIGINT PRIMARY KEY, status TEXT NOT NULL);
             TRUNCATE bench_latency_invoices;
             INSERT INTO bench_latency_invoices SELECT i, 'open' FROM generate_series(0, {}) AS i;",
            INVOICES - 1
        ),
    )
    .await?;
    // A relay process runs for days: its first claims (connections opened,
    // the claim functions compiled and planned on the kept connections)
    // are a start-up cost, paid here once and not measured.
    env::pg_reset(&pool).await?;
    open_loop(&store, usize::MAX, Mode::Notify, 1).await?;
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        for mode in [
            Mode::Notify,
            Mode::Stranger,
            Mode::Held,
            Mode::RollingMigrate,
            Mode::Polling,
            Mode::PgqDefault,
            Mode::PgqTight,
        ] {
            let contender = mode.name();
            if !scale.includes(contender) {
                continue;
            }
            env::pg_reset(&pool).await?;
            if let Some((_, per_tick)) = mode.pgq_ticker() {
                pgq::reset(&pool, per_tick).await?;
            }
            // Another application's write transaction, open in another
            // database for the whole round.
            let stranger = if mode == Mode::Stranger {
                Some(env::StrangerTransaction::open().await?)
            } else {
                None
            };
            let rollout = (mode == Mode::RollingMigrate).then(|| rolling_restart(seconds));
            let (latencies, mut transactions) = open_loop(&store, round, mode, seconds).await?;
            if let Some(rollout) = rollout {
                let migrations = rollout.await??;
                progress(format!(
                    "round {round} {contender}: migrate() took {}",
                    migrations
                        .iter()
                        .map(|d| format!("{:.1} ms", d.as_secs_f64() * 1_000.0))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if let Some(stranger) = stranger {
                stranger.end().await?;
            }
            let mut values = latencies;
            let t = percentiles(&mut transactions, &[50.0, 99.0]);
            rounds.add(contender, "producer txn p50 ms", t[0], false);
            rounds.add(contender, "producer txn p99 ms", t[1], false);
            let p = percentiles(&mut values, &[50.0, 90.0, 99.0, 100.0]);
            for (metric, value) in ["p50 ms", "p90 ms", "p99 ms", "max ms"].iter().zip(&p) {
                rounds.add(contender, metric, *value, false);
            }
            progress(format!(
                "round {round} {contender}: p50 {:.2} ms, p99 {:.2} ms",
                p[0], p[2]
            ));
        }
        if scale.includes("idle") {
            env::pg_reset(&pool).await?;
            let per_second = idle_queries(&store, idle_seconds).await?;
            rounds.add("idle-notify", "queries/s", per_second, false);
            progress(format!(
                "round {round} idle relay: {per_second:.2} statements/s"
            ));
        }
    }
    rounds.finish(NAME, report);
    let m =
        |report: &Report, c: &str, metric: &str| report.median(NAME, c, metric).unwrap_or(f64::NAN);
    let worst =
        |report: &Report, c: &str, metric: &str| report.worst(NAME, c, metric).unwrap_or(f64::NAN);
    let idle = m(report, "idle-notify", "queries/s");
    for (mode, label) in [
        (Mode::Notify, "notify"),
        (Mode::Stranger, "notify, stranger txn open"),
    ] {
        let p50 = worst(report, mode.name(), "p50 ms");
        let p99 = worst(report, mode.name(), "p99 ms");
        report.target(TargetCheck::at_most(
            format!("latency: {label} p50 ms at 1,000 events/s (worst round)"),
            p50,
            2.0,
        ));
        report.target(TargetCheck::at_most(
            format!("latency: {label} p99 ms at 1,000 events/s (worst round)"),
            p99,
            10.0,
        ));
    }
    report.target(TargetCheck::at_most(
        "producers: others' txn p99, 20% held / none held",
        m(report, Mode::Held.name(), "producer txn p99 ms")
            / m(report, Mode::Notify.name(), "producer txn p99 ms"),
        1.2,
    ));
    report.target(TargetCheck::at_most(
        "producers: txn p99, rolling restart (3 x migrate(), report open) / none",
        m(report, Mode::RollingMigrate.name(), "producer txn p99 ms")
            / m(report, Mode::Notify.name(), "producer txn p99 ms"),
        1.2,
    ));
    for metric in ["p50 ms", "p99 ms"] {
        report.target(TargetCheck::reported(
            format!("latency: notify {metric} / PgQ ticked every 10 ms"),
            m(report, Mode::Notify.name(), metric) / m(report, Mode::PgqTight.name(), metric),
        ));
    }
    report.target(TargetCheck::at_most(
        "idle relay (notify) statements/s",
        idle,
        2.0,
    ));
    pool.close().await;
    Ok(())
}

/// Offers one event per transaction every millisecond for `seconds`, on
/// schedule whatever the commits take, and returns each event's time from
/// its commit returning to its delivery, in milliseconds.
/// The producer transactions' times (enqueue+commit, the held ones left
/// out) come second.
async fn open_loop(
    store: &Arc<PgStore>,
    round: usize,
    mode: Mode,
    seconds: u64,
) -> Result<(Vec<f64>, Vec<f64>), Error> {
    let total = RATE * seconds;
    let publisher = Arc::new(CountingPublisher::noop(1_000).recording_arrivals());
    let shutdown = CancellationToken::new();
    let handles = match mode.pgq_ticker() {
        Some((period, _)) => {
            let pool = store.pool().clone();
            let poll = Duration::from_millis(10);
            vec![
                pgq::spawn_ticker(pool.clone(), period, shutdown.clone()),
                pgq::spawn_consumer(pool, publisher.clone(), poll, shutdown.clone()),
            ]
        }
        None => {
            let mut relay = Relay::new(store.clone(), publisher.clone(), RelayConfig::default())?;
            if mode != Mode::Polling {
                relay = relay.with_wake_up(store.wake_up().await?);
            }
            let relay = relay.spawn(shutdown.clone());
            vec![tokio::spawn(async move {
                relay.await?.map(drop).map_err(Error::from)
            })]
        }
    };
    // Let the relay reach its idle wait before the first event.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let commits: Arc<Mutex<HashMap<EventId, Instant>>> = Arc::default();
    let start = tokio::time::Instant::now();
    let mut producers = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until(start + Duration::from_micros(i * 1_000_000 / RATE)).await;
        let store = store.clone();
        let commits = commits.clone();
        producers.push(tokio::spawn(async move {
            let event = env::event(round, i as usize);
            let mut tx = store.pool().begin().await?;
            // The business change first: the transaction has its id
            // before its event is written.
            sqlx::query("UPDATE bench_latency_invoices SET status = 'paid' WHERE id = $1")
                .bind((i % INVOICES) as i64)
                .execute(&mut *tx)
                .await?;
            let began = Instant::now();
            if mode.pgq_ticker().is_some() {
                pgq::insert_events(&mut tx, std::slice::from_ref(&event)).await?;
            } else {
                store.enqueue(&mut tx, std::slice::from_ref(&event)).await?;
            }
            let held = mode.hold(i);
            if let Some(hold) = held {
                tokio::time::sleep(hold).await;
            }
            tx.commit().await?;
            let committed = Instant::now();
            commits
                .lock()
                .expect("commits")
                .insert(event.event_id, committed);
            Ok::<_, Error>(
                held.is_none()
                    .then(|| (committed - began).as_secs_f64() * 1_000.0),
            )
        }));
    }
    let mut transactions = Vec::with_capacity(producers.len());
    for producer in producers {
        transactions.extend(producer.await??);
    }
    let offered = start.elapsed();
    let reached = tokio::time::timeout(Duration::from_secs(30), publisher.wait_for(total)).await;
    shutdown.cancel();
    for handle in handles {
        handle.await??;
    }
    if reached.is_err() {
        return Err(format!("only {} of {total} events delivered", publisher.delivered()).into());
    }
    if offered > Duration::from_secs(seconds) + Duration::from_millis(500) {
        // The figures then describe a lower offered rate: say so loudly;
        // the smoke run (a debug build on a busy machine) only warns.
        eprintln!(
            "WARNING: the producer fell behind its schedule: {total} events took {offered:?}"
        );
    }
    let arrivals = publisher.take_arrivals();
    let commits = commits.lock().expect("commits");
    let latencies = commits
        .iter()
        .map(|(id, committed)| {
            let arrived = arrivals
                .get(id)
                .ok_or_else(|| format!("event {id} never delivered"))?;
            Ok(arrived.saturating_duration_since(*committed).as_secs_f64() * 1_000.0)
        })
        .collect::<Result<_, Error>>()?;
    Ok((latencies, transactions))
}

/// A rolling restart beside the round: a report opens a transaction that
/// reads the events table and keeps it open; three application instances
/// then start a quarter of the round apart, each with a pool of its own,
/// and call `migrate()` as every example does at start-up. Returns each
/// migrate()'s time.
fn rolling_restart(seconds: u64) -> tokio::task::JoinHandle<Result<Vec<Duration>, Error>> {
    tokio::spawn(async move {
        let reports = env::pg_pool(1).await?;
        let mut report = reports.begin().await?;
        sqlx::query("SELECT count(*) FROM bench_events")
            .execute(&mut *report)
            .await?;
        let mut migrations = Vec::with_capacity(3);
        let step = Duration::from_millis(seconds * 1_000 / 4);
        for _ in 0..3 {
            tokio::time::sleep(step).await;
            let instance = env::pg_pool(2).await?;
            let started = Instant::now();
            env::pg_store(&instance).await?;
            migrations.push(started.elapsed());
            instance.close().await;
        }
        report.rollback().await?;
        reports.close().await;
        Ok(migrations)
    })
}

/// Statements per second a relay with LISTEN/NOTIFY sends while the outbox
/// stays empty, measured after it settles into its idle loop.
async fn idle_queries(store: &Arc<PgStore>, seconds: u64) -> Result<f64, Error> {
    let publisher = Arc::new(CountingPublisher::noop(256));
    let relay = Relay::new(store.clone(), publisher, RelayConfig::default())?
        .with_wake_up(store.wake_up().await?);
    let shutdown = CancellationToken::new();
    let handle = relay.spawn(shutdown.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    query_count::start();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let statements = query_count::stop();
    let elapsed = started.elapsed();
    shutdown.cancel();
    handle.await??;
    Ok(statements as f64 / elapsed.as_secs_f64())
}
