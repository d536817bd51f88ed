//! Many tenants relayed by one fleet on one pool (issue 36): a schema per
//! tenant in the bench database, every tenant's relay in this process on
//! a pool of eight connections (`PgTenantRelays`, no kept connections,
//! idle relays woken through one shared LISTEN connection).
//!
//! * `drain-N`: the same total of events spread over N tenants, drained by
//!   the fleet, against one tenant alone.
//! * `idle-poll` / `idle-listen`: every tenant idle: transactions a second
//!   per tenant (the bench database's committed transactions) and the
//!   process's resident memory per tenant (from the first fleet of the
//!   run, before any drain); polling every second without LISTEN, or woken
//!   by the shared LISTEN with the daemon's 10 s backstop poll.
//! * `quiet-alone` / `quiet-beside-hot` / `quiet-beside-hot-unpaced`: a
//!   tenant receiving 1,000 events/s (one a transaction), alone or while
//!   another tenant drains a backlog, with the fleet's default
//!   `FairShare` (the backlog rests while the quiet one is served) or
//!   without it; its commit→publish p99, and the hot one's drain rate.
//!   `quiet-beside-hot-one-shard`: the same with both tenants on one shard
//!   of three connections (`PgTenantStores::sharded`, as the daemon splits
//!   its connections from eight on): a quiet tenant sharing the hot one's
//!   shard, the worst case of the daemon's default.
//! * `daemon` / `daemon-N`: the `outbox relay` binary's resident memory
//!   with one idle tenant and with every tenant schema, measured once
//!   after the rounds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::tenants::{FairShare, FleetConfig, TenantFleet, TenantId, TenantList};
use outbox_core::{CancellationToken, EventId, OutboxWriter, RelayConfig, RelayId};
use outbox_sqlx::postgres::{PgStore, PgTenantRelays, PgTenantStores};
use outbox_sqlx::{StoreConfig, TableNames};
use sqlx::PgPool;

use super::{Rounds, Scale, progress, rate};
use crate::counting::CountingPublisher;
use crate::env::{self, Error};
use crate::open_loop::open_loop;
use crate::report::{Report, TargetCheck};
use crate::stats::percentiles;

/// Scenario name.
pub const NAME: &str = "tenants-postgres";
/// The fleet's pool.
const CONNECTIONS: u32 = 8;
/// The quiet tenant's producer rate.
const RATE: u64 = 1_000;
/// A shard's connections, as the daemon makes them.
const SHARD_CONNECTIONS: u32 = 3;
/// The quiet tenant's producers' own pool: commits slowed by the hot
/// tenant's drain must not queue for a connection (the open loop's
/// lateness would count as the relay's).
const PRODUCER_CONNECTIONS: u32 = 16;

fn schema(i: usize) -> String {
    format!("bench_tenant_{i}")
}

fn tenant(i: usize) -> TenantId {
    TenantId::new(schema(i)).expect("a valid tenant id")
}

fn store(pool: &PgPool, i: usize) -> Result<PgStore, Error> {
    let tables = TableNames::default().in_schema(&schema(i))?;
    Ok(PgStore::new(pool.clone(), StoreConfig::with_tables(tables)))
}

/// `n` events of tenant `i` over 100 keys, in transactions of 1,000;
/// their ids.
async fn fill(pool: &PgPool, i: usize, round: usize, n: usize) -> Result<Vec<EventId>, Error> {
    let store = store(pool, i)?;
    let events: Vec<_> = (0..n).map(|k| env::event(round, k)).collect();
    for chunk in events.chunks(1_000) {
        OutboxWriter::enqueue(&store, chunk).await?;
    }
    Ok(events.iter().map(|e| e.event_id).collect())
}

/// How idle tenants learn of new events.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waking {
    /// Each polls every second (the relay's default).
    Poll,
    /// The shared LISTEN, with the relays' default poll as the backstop.
    Listen,
    /// The shared LISTEN, with the daemon's 10 s backstop poll.
    ListenLongPoll,
}

/// The fleet over tenants `0..n`, publishing into `publisher`.
fn fleet(
    pool: &PgPool,
    n: usize,
    publisher: Arc<CountingPublisher>,
    waking: Waking,
    share: FairShare,
    shard: Option<&PgPool>,
) -> TenantFleet<PgTenantRelays<CountingPublisher>> {
    let mut relay = RelayConfig {
        relay_id: RelayId::unique("tenants"),
        ..RelayConfig::default()
    };
    if waking == Waking::ListenLongPoll {
        relay.poll_interval = Duration::from_secs(10);
    }
    let mut stores = PgTenantStores::new(pool.clone(), StoreConfig::default());
    if waking == Waking::Poll {
        stores = stores.polling_only();
    }
    if let Some(shard) = shard {
        stores = stores.sharded(vec![shard.clone()]);
    }
    let relays = PgTenantRelays::new(stores, relay, move |_| publisher.clone());
    TenantFleet::new(
        TenantList::new((0..n).map(tenant)),
        relays,
        FleetConfig {
            share,
            ..FleetConfig::default()
        },
    )
}

/// The bench database's committed transactions so far.
async fn commits(pool: &PgPool) -> Result<i64, Error> {
    Ok(sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?)
}

/// This process's resident memory, in KiB.
fn resident_kib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(f64::NAN)
}

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let total = scale.pick(100_000, 2_000);
    let counts: &[usize] = if scale.quick {
        &[1, 10]
    } else {
        &[1, 100, 1_000]
    };
    let most = *counts.last().expect("tenant counts");
    let setup = env::pg_pool(4).await?;
    let started = Instant::now();
    for i in 0..most {
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {}", schema(i)))
            .execute(&setup)
            .await?;
        store(&setup, i)?.migrate().await?;
    }
    let migrate_ms = started.elapsed().as_secs_f64() * 1_000.0 / most as f64;
    progress(format!(
        "{most} tenant schemas migrated, {migrate_ms:.0} ms each"
    ));
    let pool = warm_pool(CONNECTIONS).await?;
    let producers = warm_pool(PRODUCER_CONNECTIONS).await?;
    let shard = warm_pool(SHARD_CONNECTIONS).await?;
    let mut rounds = Rounds::default();
    if scale.includes("quiet-alone") || scale.includes("quiet-beside-hot") {
        // Unmeasured: every connection of the fleet's pool has run the
        // relay's statements once (a connection's first call of a PL/pgSQL
        // function compiles it: start-up, not a tenant's fairness).
        // The shard's connections too.
        let quiet = Quiet {
            setup: &setup,
            pool: &pool,
            shard: &shard,
            producers: &producers,
        };
        for one_shard in [false, true] {
            quiet
                .p99(scale.rounds, total, 1, FairShare::default(), one_shard)
                .await?;
        }
        progress("quiet tenant warmed up");
    }
    for round in 0..scale.rounds {
        for (contender, waking) in [
            ("idle-poll", Waking::Poll),
            ("idle-listen", Waking::ListenLongPoll),
        ] {
            if !scale.includes(contender) {
                continue;
            }
            // Measured once every tenant's start (a heartbeat, a claim, a
            // probe, a producer watch: 4,000 statements for 1,000 tenants
            // on eight connections, some seconds) is over, for two
            // backstop polls of the slowest: the tenants start together,
            // so their polls come in waves.
            let (warm_up, window) = if scale.quick { (2, 5) } else { (15, 20) };
            let (per_tenant, kib) = idle(&pool, most, waking, warm_up, window).await?;
            rounds.add(contender, "transactions/s per tenant", per_tenant, false);
            // Memory only from the first fleet of the process: later ones
            // reuse what the allocator already holds.
            if round == 0 && waking == Waking::Poll {
                rounds.add(contender, "KiB per tenant", kib, false);
            }
            progress(format!(
                "round {round} {contender} x{most}: {per_tenant:.2} transactions/s and {kib:.0} KiB per tenant"
            ));
        }
        for &n in counts {
            let contender = format!("drain-{n}");
            if !scale.includes(&contender) {
                continue;
            }
            for i in 0..n {
                fill(&setup, i, round, total / n).await?;
            }
            let publisher = Arc::new(CountingPublisher::noop(256));
            let shutdown = CancellationToken::new();
            let started = Instant::now();
            let running = tokio::spawn(
                fleet(
                    &pool,
                    n,
                    publisher.clone(),
                    Waking::Listen,
                    FairShare::default(),
                    None,
                )
                .run(shutdown.clone()),
            );
            let expected = (total / n * n) as u64;
            tokio::time::timeout(Duration::from_secs(300), publisher.wait_for(expected))
                .await
                .map_err(|_| {
                    format!(
                        "{contender}: {} of {expected} delivered",
                        publisher.delivered()
                    )
                })?;
            let elapsed = started.elapsed();
            shutdown.cancel();
            running.await?;
            rounds.add(&contender, "events/s", rate(expected, elapsed), true);
            progress(format!(
                "round {round} {contender}: {:.0} events/s",
                rate(expected, elapsed)
            ));
        }
        let unpaced = FairShare {
            backlog_rest: 0.0,
            ..FairShare::default()
        };
        for (contender, hot, share, one_shard) in [
            ("quiet-alone", 0, FairShare::default(), false),
            ("quiet-beside-hot", total, FairShare::default(), false),
            ("quiet-beside-hot-unpaced", total, unpaced, false),
            (
                "quiet-beside-hot-one-shard",
                total,
                FairShare::default(),
                true,
            ),
        ] {
            if !scale.includes(contender) {
                continue;
            }
            let quiet = Quiet {
                setup: &setup,
                pool: &pool,
                shard: &shard,
                producers: &producers,
            };
            let p99 = quiet
                .p99(round, hot, scale.pick(3, 1) as u64, share, one_shard)
                .await?;
            if hot > 0 {
                rounds.add(contender, "hot events/s", p99.hot_rate, true);
            }
            rounds.add(contender, "p99 ms", p99.after_commit, false);
            rounds.add(contender, "from-begin p99 ms", p99.from_begin, false);
            rounds.add(contender, "producer p99 ms", p99.producer, false);
            let p99 = p99.after_commit;
            progress(format!(
                "round {round} {contender}: quiet tenant p99 {p99:.1} ms"
            ));
        }
    }
    if scale.includes("daemon") {
        // Once, after every round: the daemon's idle tenants publish
        // nothing (every event is published by now).
        let settle = Duration::from_secs(if scale.quick { 2 } else { 10 });
        let (alone, all) = super::tenants_daemon::resident(most, settle).await?;
        let per_tenant = (all - alone) / (most - 1) as f64;
        rounds.add("daemon", "MiB, one tenant", alone / 1024.0, false);
        rounds.add(&format!("daemon-{most}"), "MiB", all / 1024.0, false);
        rounds.add(
            &format!("daemon-{most}"),
            "KiB per added tenant",
            per_tenant,
            false,
        );
        progress(format!(
            "daemon: {:.1} MiB with one tenant, {:.1} MiB with {most} ({per_tenant:.0} KiB per added tenant)",
            alone / 1024.0,
            all / 1024.0
        ));
    }
    rounds.add("setup", "migrate ms per tenant", migrate_ms, false);
    rounds.finish(NAME, report);
    let m = |c: &str, metric: &str| report.median(NAME, c, metric).unwrap_or(f64::NAN);
    let mut targets: Vec<TargetCheck> = counts[1..]
        .iter()
        .map(|n| {
            TargetCheck::reported(
                format!("tenants: drain over {n} tenants / one tenant, same total"),
                m(&format!("drain-{n}"), "events/s") / m("drain-1", "events/s"),
            )
        })
        .collect();
    targets.push(TargetCheck::at_most(
        "tenants: quiet tenant's p99 beside a draining one / alone",
        m("quiet-beside-hot", "p99 ms") / m("quiet-alone", "p99 ms"),
        1.5,
    ));
    targets.push(TargetCheck::reported(
        "tenants: the same without the fair share (backlog_rest 0)",
        m("quiet-beside-hot-unpaced", "p99 ms") / m("quiet-alone", "p99 ms"),
    ));
    targets.push(TargetCheck::at_most(
        "tenants: the same, both on one shard of three connections",
        m("quiet-beside-hot-one-shard", "p99 ms") / m("quiet-alone", "p99 ms"),
        1.5,
    ));
    for target in targets {
        report.target(target);
    }
    Ok(())
}

/// The fleet over `n` idle tenants: committed transactions a second (each
/// statement of a store without kept connections is two: its parse and
/// its execution) and KiB of resident memory per tenant, over `window`
/// seconds after `warm_up`.
async fn idle(
    pool: &PgPool,
    n: usize,
    waking: Waking,
    warm_up: u64,
    window: u64,
) -> Result<(f64, f64), Error> {
    let before = resident_kib();
    let publisher = Arc::new(CountingPublisher::noop(256));
    let shutdown = CancellationToken::new();
    let fleet = fleet(pool, n, publisher, waking, FairShare::default(), None);
    let status = fleet.status();
    let running = tokio::spawn(fleet.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(warm_up)).await;
    let first = commits(pool).await?;
    let measured = Instant::now();
    tokio::time::sleep(Duration::from_secs(window)).await;
    let last = commits(pool).await?;
    let seconds = measured.elapsed().as_secs_f64();
    let after = resident_kib();
    let up = status
        .tenants()
        .values()
        .filter(|s| s.state == outbox_core::tenants::TenantState::Running)
        .count();
    shutdown.cancel();
    running.await?;
    if up != n {
        return Err(format!("only {up} of {n} idle tenants' relays ran").into());
    }
    // The two reads of pg_stat_database are transactions too.
    let per_tenant = ((last - first - 2) as f64 / seconds) / n as f64;
    Ok((per_tenant, (after - before) / n as f64))
}

/// A pool of `n` connections, every one of them opened: connecting is
/// not part of a producer's commit.
async fn warm_pool(n: u32) -> Result<PgPool, Error> {
    let pool = env::pg_bench_pool(n).await?;
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(pool.acquire().await?);
    }
    drop(held);
    Ok(pool)
}

/// Waits until tenant `i`'s relay has found nothing and asked for NOTIFY
/// (its idle probe set `relay_waiting`).
async fn wait_until_listening(setup: &PgPool, i: usize) -> Result<(), Error> {
    let waiting = format!(
        "SELECT pg_sequence_last_value('{}.outbox_relay_waiting') IS NOT DISTINCT FROM 1",
        schema(i)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while sqlx::query_scalar::<_, bool>(&waiting)
        .fetch_optional(setup)
        .await?
        != Some(true)
    {
        if Instant::now() > deadline {
            return Err(format!("tenant {i}'s relay did not wait for NOTIFY within 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The quiet tenant's p99s, in milliseconds, and the hot one's drain.
struct QuietP99 {
    /// From the producer's commit acknowledgement to publication (0 when
    /// the relay, woken by the commit's NOTIFY, published first).
    after_commit: f64,
    /// From the start of the producer's transaction to publication.
    from_begin: f64,
    /// The producer's transaction itself.
    producer: f64,
    /// The hot tenant's events a second, from the fleet's start to its
    /// last publication.
    hot_rate: f64,
}

/// The pools of the quiet tenant's measurement.
struct Quiet<'a> {
    /// Fills and flags.
    setup: &'a PgPool,
    /// The fleet's.
    pool: &'a PgPool,
    /// One shard of the fleet's tenants.
    shard: &'a PgPool,
    /// The quiet tenant's producers'.
    producers: &'a PgPool,
}

impl Quiet<'_> {
    /// Tenant 0 receives `RATE` events a second for `seconds` while tenant
    /// 1 drains `hot` events committed before, under `share`: tenant 0's
    /// p99s, over its events committed before the last of tenant 1's was
    /// published.
    async fn p99(
        &self,
        round: usize,
        hot: usize,
        seconds: u64,
        share: FairShare,
        one_shard: bool,
    ) -> Result<QuietP99, Error> {
        let Quiet {
            setup,
            pool,
            shard,
            producers,
        } = *self;
        let shard = one_shard.then_some(shard);
        let hot_ids = fill(setup, 1, round, hot).await?;
        // The WAL of the fill (and of former rounds) is written out now, not
        // by a checkpoint in the middle of the measurement.
        sqlx::query("CHECKPOINT").execute(setup).await?;
        // A flag a former fleet left set would end the wait below at once.
        sqlx::query(&format!(
            "SELECT setval('{}.outbox_relay_waiting', 0)",
            schema(0)
        ))
        .execute(setup)
        .await?;
        let publisher = Arc::new(CountingPublisher::noop(256).recording_arrivals());
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let running = tokio::spawn(
            fleet(pool, 2, publisher.clone(), Waking::Listen, share, shard).run(shutdown.clone()),
        );
        // Measured from the quiet relay's first wait for NOTIFY: its start
        // (the schema check, the first heartbeat and claim) is not latency.
        wait_until_listening(setup, 0).await?;
        let quiet = Arc::new(store(producers, 0)?);
        let commits: Arc<Mutex<HashMap<EventId, (Instant, Instant)>>> = Arc::default();
        let total = RATE * seconds;
        open_loop(RATE, total, |i| {
            let (quiet, commits) = (quiet.clone(), commits.clone());
            async move {
                let event = env::event(round, i as usize);
                let began = Instant::now();
                OutboxWriter::enqueue(quiet.as_ref(), std::slice::from_ref(&event)).await?;
                commits
                    .lock()
                    .expect("commits")
                    .insert(event.event_id, (began, Instant::now()));
                Ok(())
            }
        })
        .await?;
        let everything = total + hot as u64;
        tokio::time::timeout(Duration::from_secs(300), publisher.wait_for(everything))
            .await
            .map_err(|_| format!("{} of {everything} delivered", publisher.delivered()))?;
        shutdown.cancel();
        running.await?;
        let arrivals = publisher.take_arrivals();
        let hot_done = hot_ids
            .iter()
            .filter_map(|id| arrivals.get(id))
            .max()
            .copied();
        let ms =
            |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64() * 1_000.0;
        let (mut after_commit, mut from_begin, mut producer) = (Vec::new(), Vec::new(), Vec::new());
        for (id, (began, committed)) in commits.lock().expect("commits").iter() {
            if hot_done.is_some_and(|done| *committed > done) {
                continue;
            }
            let at = *arrivals
                .get(id)
                .ok_or_else(|| format!("event {id} never delivered"))?;
            after_commit.push(ms(*committed, at));
            from_begin.push(ms(*began, at));
            producer.push(ms(*began, *committed));
        }
        if after_commit.is_empty() {
            return Err("no quiet event was committed while the other tenant drained".into());
        }
        Ok(QuietP99 {
            after_commit: percentiles(&mut after_commit, &[99.0])[0],
            from_begin: percentiles(&mut from_begin, &[99.0])[0],
            producer: percentiles(&mut producer, &[99.0])[0],
            hot_rate: hot_done.map_or(f64::NAN, |done| {
                rate(hot as u64, done.saturating_duration_since(started))
            }),
        })
    }
}
