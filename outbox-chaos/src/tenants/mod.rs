//! The tenants soak: one `outbox relay` daemon over a hundred tenant
//! schemas of a private PostgreSQL, for minutes. Producers spread events
//! over the tenants (Zipf), one hot tenant takes bursts, a tenant schema is
//! created and another dropped every few seconds, the daemon is redeployed
//! (SIGTERM, drain, start) and purges on a short schedule. It fails on a
//! lost event, a tenant created while running that does not start, other
//! tenants held back while the hot one drains (their p99 above twice their
//! quiet p99 plus 250 ms), a latency that rises as the run goes on, the
//! daemon's memory growing with the churn, its connections above
//! `[tenants] connections`, a history that outgrows the retention window,
//! or `/health` not counting every tenant running at the end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_core::{CancellationToken, EventId};

use crate::Error;
use crate::cluster::{PrivatePg, PrivateRedis};

mod checks;
mod daemon;
mod traffic;

use daemon::{Daemon, OWN_APPLICATION, daemon_connections};
use traffic::{Live, Traffic, churn, make_tenant, produce, tenant_name};

/// The tenant whose bursts the others must not wait for.
const HOT: &str = "t_hot";

/// The size and pace of a tenants soak.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    duration: Duration,
    tenants: usize,
    rate: f64,
    burst_every: Duration,
    burst_events: usize,
    churn_every: Duration,
    deploy_every: Duration,
    connections: u32,
    retention: Duration,
    purge_every: Duration,
    /// `--pg-setting S`: added to the private server's configuration
    /// (`autovacuum = off` shows what autovacuum's sweeps cost).
    pg_settings: Vec<String>,
}

impl Settings {
    /// Two minutes over 100 tenants on 8 connections (the daemon's
    /// default) unless `--minutes N`
    /// / `--tenants N` / `--connections N`;
    /// `--pg-setting S` (repeatable) configures the private server.
    pub(crate) fn from_args(args: &[String]) -> Self {
        let mut settings = Self {
            duration: Duration::from_secs(120),
            tenants: 100,
            rate: 200.0,
            burst_every: Duration::from_secs(40),
            burst_events: 5_000,
            churn_every: Duration::from_secs(7),
            deploy_every: Duration::from_secs(80),
            connections: 8,
            retention: Duration::from_secs(10),
            purge_every: Duration::from_secs(5),
            pg_settings: Vec::new(),
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut number = |what: &str| -> u64 {
                args.next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{what} needs a number"))
            };
            match arg.as_str() {
                "--minutes" => settings.duration = Duration::from_secs(number("--minutes") * 60),
                "--tenants" => settings.tenants = number("--tenants").max(3) as usize,
                "--connections" => settings.connections = number("--connections").max(2) as u32,
                "--pg-setting" => settings
                    .pg_settings
                    .push(args.next().expect("--pg-setting needs a setting").clone()),
                other => panic!("unknown argument {other}"),
            }
        }
        settings
    }
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// One committed event: its tenant, when its transaction committed (ms
/// since the epoch), and whether it was part of a hot burst.
struct Sent {
    tenant: String,
    committed_ms: u128,
    hot: bool,
}

/// What the daemon looked like at one moment.
struct Sample {
    at_ms: u128,
    rss_mib: Option<f64>,
    connections: i64,
    /// Rows in every tenant's events table (every fifth sample).
    rows: Option<i64>,
}

/// What the run observed along the way.
#[derive(Default)]
struct Observed {
    sent: HashMap<EventId, Sent>,
    /// Each burst: its first commit and its last (ms since the epoch).
    bursts: Vec<(u128, u128)>,
    /// Each redeploy: from SIGTERM to the new daemon running every tenant.
    deploys: Vec<(u128, u128)>,
    /// Tenants created while running, and when.
    joined: HashMap<String, u128>,
    dropped: usize,
    /// Drops that met a relay mid-claim (`deadlock detected`) and were
    /// tried again.
    drops_retried: usize,
    samples: Vec<Sample>,
}

/// Rows in every tenant's events table.
async fn rows(pool: &sqlx::PgPool) -> Result<i64, Error> {
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 't\\_%' ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    let counts: Vec<String> = schemas
        .iter()
        .map(|s| format!("(SELECT count(*) FROM {s}.outbox_events)"))
        .collect();
    Ok(
        sqlx::query_scalar(&format!("SELECT ({})::bigint", counts.join(" + ")))
            .fetch_one(pool)
            .await?,
    )
}

pub(crate) async fn run(settings: Settings) -> Result<(), Error> {
    let started = Instant::now();
    let mut server_settings = vec!["max_connections = 100"];
    server_settings.extend(settings.pg_settings.iter().map(String::as_str));
    let pg = PrivatePg::start(&server_settings);
    pg.psql("postgres", "CREATE DATABASE soak");
    let url = pg.url("soak");
    let redis = PrivateRedis::start();
    let options: sqlx::postgres::PgConnectOptions = url.parse()?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options.application_name(OWN_APPLICATION))
        .await?;
    let mut live = Live::default();
    for n in 0..settings.tenants - 1 {
        let tenant = tenant_name(n);
        make_tenant(&pool, &tenant).await?;
        live.tenants.push(tenant);
    }
    live.made = settings.tenants - 1;
    make_tenant(&pool, HOT).await?;
    println!(
        "# outbox-chaos tenants: {:?} of one `outbox relay` over {} tenant schemas ({} connections): \
         {}/s over Zipf tenants, {} events on one tenant every {:?}, a tenant created and one dropped every {:?}, \
         a redeploy every {:?}, purge every {:?} keeping {:?}",
        settings.duration,
        settings.tenants,
        settings.connections,
        settings.rate,
        settings.burst_events,
        settings.burst_every,
        settings.churn_every,
        settings.deploy_every,
        settings.purge_every,
        settings.retention
    );
    let dir = std::env::temp_dir().join(format!("outbox-tenants-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut daemon = Daemon::start(&dir, &url, &redis.url(), &settings)?;
    if let Err(health) = daemon
        .until_all_running(&pool, Duration::from_secs(60))
        .await
    {
        return Err(format!(
            "the daemon did not run every tenant within 60 s ({health}; log: {})",
            daemon.log().display()
        )
        .into());
    }
    println!(
        "  .. {:>6.1} s  every tenant running",
        started.elapsed().as_secs_f64()
    );

    let live = Arc::new(tokio::sync::Mutex::new(live));
    let observed = Arc::new(Mutex::new(Observed::default()));
    let done = CancellationToken::new();
    let traffic = Traffic {
        pool: pool.clone(),
        settings: settings.clone(),
        live: live.clone(),
        observed: observed.clone(),
        done: done.clone(),
    };
    let producer = tokio::spawn(produce(traffic.clone()));
    let churner = tokio::spawn(churn(traffic));
    let traffic_started = Instant::now();
    let mut next_deploy = traffic_started + settings.deploy_every / 2;
    let mut tick = 0u64;
    while traffic_started.elapsed() < settings.duration {
        tokio::time::sleep(Duration::from_secs(2)).await;
        // A producer or churner that stopped on an error says why now,
        // not as whatever check its absence breaks later.
        if producer.is_finished() || churner.is_finished() {
            break;
        }
        tick += 1;
        let sample = Sample {
            at_ms: now_ms(),
            rss_mib: daemon.rss_mib(),
            connections: daemon_connections(&pool).await?,
            rows: match tick % 5 {
                0 => rows(&pool).await.ok(),
                _ => None,
            },
        };
        observed.lock().expect("observed").samples.push(sample);
        if Instant::now() >= next_deploy {
            next_deploy += settings.deploy_every;
            let from = now_ms();
            // It waits for the old process's drain: off the async workers.
            tokio::task::block_in_place(|| daemon.redeploy())?;
            if let Err(health) = daemon
                .until_all_running(&pool, Duration::from_secs(60))
                .await
            {
                return Err(format!(
                    "the redeployed daemon did not run every tenant within 60 s ({health}; log: {})",
                    daemon.log().display()
                )
                .into());
            }
            observed
                .lock()
                .expect("observed")
                .deploys
                .push((from, now_ms()));
        }
    }
    done.cancel();
    producer.await??;
    churner.await??;
    println!(
        "  .. {:>6.1} s  traffic over",
        started.elapsed().as_secs_f64()
    );

    let outcome =
        checks::settle_and_check(&settings, &daemon, &redis.url(), &pool, &observed).await;
    if outcome.is_err() {
        eprintln!("the daemon's log: {}", daemon.log().display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}
