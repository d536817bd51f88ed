//! Many tenants on MariaDB (issue 36): a database per tenant, every
//! tenant's relay in this process through `TenantFleet` and
//! `MySqlTenantRelays` on one pool of eight connections (no LISTEN on
//! MariaDB: idle relays poll every second).
//!
//! * `mariadb-drain-N`: the same total of events spread over N tenant
//!   databases (1 and 10), drained by the fleet from its start; rounds
//!   interleave the two.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::tenants::{FleetConfig, TenantFleet, TenantId, TenantList};
use outbox_core::{CancellationToken, OutboxWriter, RelayConfig, RelayId};
use outbox_sqlx::mysql::{MySqlStore, MySqlTenantRelays, MySqlTenantStores};
use outbox_sqlx::{StoreConfig, TableNames, guard_cancelled_transactions};
use sqlx::Executor;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};

use super::{Rounds, Scale, progress, rate};
use crate::counting::CountingPublisher;
use crate::env::{self, Error};
use crate::report::{Report, TargetCheck};

/// Scenario name.
pub const NAME: &str = "tenants-mariadb";
/// The fleet's pool.
const CONNECTIONS: u32 = 8;
/// Tenant databases at most.
const DATABASES: usize = 10;

fn database(i: usize) -> String {
    format!("outbox_bench_tenant_{i}")
}

fn store(pool: &MySqlPool, i: usize) -> Result<MySqlStore, Error> {
    let tables = TableNames::default().in_schema(&database(i))?;
    Ok(MySqlStore::new(
        pool.clone(),
        StoreConfig::with_tables(tables),
    ))
}

/// Recreates the tenant databases (tables of an older schema never linger).
async fn create(pool: &MySqlPool) -> Result<(), Error> {
    for i in 0..DATABASES {
        pool.execute(&*format!("DROP DATABASE IF EXISTS {}", database(i)))
            .await?;
        pool.execute(&*format!("CREATE DATABASE {}", database(i)))
            .await?;
        store(pool, i)?.migrate().await?;
    }
    Ok(())
}

/// Empties every tenant's outbox: `TRUNCATE`, as `env::mysql_reset` says why.
async fn reset(pool: &MySqlPool) -> Result<(), Error> {
    for i in 0..DATABASES {
        for table in ["outbox_events", "outbox_attempts"] {
            pool.execute(&*format!("TRUNCATE TABLE {}.{table}", database(i)))
                .await?;
        }
    }
    Ok(())
}

/// Drains `total` events spread over `n` tenant databases: events/s.
async fn drain(pool: &MySqlPool, n: usize, round: usize, total: usize) -> Result<f64, Error> {
    reset(pool).await?;
    for i in 0..n {
        let store = store(pool, i)?;
        let events: Vec<_> = (0..total / n).map(|k| env::event(round, k)).collect();
        for chunk in events.chunks(1_000) {
            OutboxWriter::enqueue(&store, chunk).await?;
        }
    }
    let publisher = Arc::new(CountingPublisher::noop(256));
    let relay = RelayConfig {
        relay_id: RelayId::unique("tenants"),
        ..RelayConfig::default()
    };
    let stores = MySqlTenantStores::new(pool.clone(), StoreConfig::default());
    let sink = publisher.clone();
    let relays = MySqlTenantRelays::new(stores, relay, move |_| sink.clone());
    let tenants = (0..n).map(|i| TenantId::new(database(i)).expect("a valid tenant id"));
    let fleet = TenantFleet::new(TenantList::new(tenants), relays, FleetConfig::default());
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(fleet.run(shutdown.clone()));
    let expected = (total / n * n) as u64;
    tokio::time::timeout(Duration::from_secs(300), publisher.wait_for(expected))
        .await
        .map_err(|_| {
            format!(
                "mariadb-drain-{n}: {} of {expected} delivered",
                publisher.delivered()
            )
        })?;
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await?;
    Ok(rate(expected, elapsed))
}

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let total = scale.pick(20_000, 1_000);
    let pool = guard_cancelled_transactions(MySqlPoolOptions::new())
        .max_connections(CONNECTIONS)
        .connect(&env::mysql_server())
        .await?;
    create(&pool).await?;
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        for n in [1, DATABASES] {
            let contender = format!("mariadb-drain-{n}");
            if !scale.includes(&contender) {
                continue;
            }
            let rate = drain(&pool, n, round, total).await?;
            rounds.add(&contender, "events/s", rate, true);
            progress(format!("round {round} {contender}: {rate:.0} events/s"));
        }
    }
    rounds.finish(NAME, report);
    let m = |c: &str| report.median(NAME, c, "events/s").unwrap_or(f64::NAN);
    report.target(TargetCheck::reported(
        format!("tenants: drain over {DATABASES} MariaDB databases / one, same total"),
        m(&format!("mariadb-drain-{DATABASES}")) / m("mariadb-drain-1"),
    ));
    for i in 0..DATABASES {
        pool.execute(&*format!("DROP DATABASE IF EXISTS {}", database(i)))
            .await?;
    }
    Ok(())
}
