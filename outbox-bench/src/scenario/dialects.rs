//! The no-op drain on MariaDB and SQLite beside PostgreSQL, and on
//! PostgreSQL and MariaDB through the Diesel stores (diesel-async) beside
//! the sqlx ones: same relay, same events, same batch size, same tables.

use std::sync::Arc;

use outbox_core::Ordering;

use super::{Rounds, Scale, progress, rate};
use crate::counting::CountingPublisher;
use crate::env::{self, Error};
use crate::relay_run;
use crate::report::{Report, TargetCheck};

/// Scenario name.
pub const NAME: &str = "drain-dialects";
const BATCH: usize = 1_000;

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let n = scale.pick(50_000, 2_000);
    let pool = env::pg_pool(8).await?;
    let pg = Arc::new(env::pg_store(&pool).await?);
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        for dialect in [
            "postgres",
            "postgres-diesel",
            "mariadb",
            "mariadb-diesel",
            "sqlite",
        ] {
            if !scale.includes(dialect) {
                continue;
            }
            let elapsed = match dialect {
                "postgres" => {
                    env::pg_reset(&pool).await?;
                    env::pg_fill(&pg, round, n).await?;
                    drain(pg.clone(), n).await?
                }
                "postgres-diesel" => {
                    env::pg_reset(&pool).await?;
                    env::pg_fill(&pg, round, n).await?;
                    drain(Arc::new(env::diesel_pg_store()?), n).await?
                }
                "mariadb" | "mariadb-diesel" => {
                    // Filled through sqlx either way: the rows are the same.
                    let store = Arc::new(env::mysql_store(8).await?);
                    env::mysql_reset(&store).await?;
                    env::fill_writer(store.as_ref(), n, |i| env::event(round, i)).await?;
                    let elapsed = if dialect == "mariadb" {
                        drain(store.clone(), n).await?
                    } else {
                        drain(Arc::new(env::diesel_mysql_store(8)?), n).await?
                    };
                    store.pool().close().await;
                    elapsed
                }
                _ => {
                    let store = Arc::new(
                        env::sqlite_store(std::path::Path::new("target/bench/sqlite")).await?,
                    );
                    env::fill_writer(store.as_ref(), n, |i| env::event(round, i)).await?;
                    let elapsed = drain(store.clone(), n).await?;
                    store.pool().close().await;
                    elapsed
                }
            };
            rounds.add(dialect, "events/s", rate(n as u64, elapsed), true);
            progress(format!(
                "round {round} {dialect}: {:.0} events/s",
                rate(n as u64, elapsed)
            ));
        }
    }
    rounds.finish(NAME, report);
    let pg = report
        .median(NAME, "postgres", "events/s")
        .unwrap_or(f64::NAN);
    for dialect in ["postgres-diesel", "mariadb", "sqlite"] {
        let ratio = report.median(NAME, dialect, "events/s").unwrap_or(f64::NAN) / pg;
        report.target(TargetCheck::reported(
            format!("drain: {dialect} / postgres (sqlx)"),
            ratio,
        ));
    }
    let mariadb = report
        .median(NAME, "mariadb", "events/s")
        .unwrap_or(f64::NAN);
    let diesel = report
        .median(NAME, "mariadb-diesel", "events/s")
        .unwrap_or(f64::NAN);
    report.target(TargetCheck::reported(
        "drain: mariadb-diesel / mariadb (sqlx)",
        diesel / mariadb,
    ));
    pool.close().await;
    Ok(())
}

/// The same relay over any store: per-key, batch [`BATCH`], no-op publisher.
async fn drain<S>(store: Arc<S>, n: usize) -> Result<std::time::Duration, Error>
where
    S: outbox_core::OutboxStore + outbox_core::OutboxAdmin + 'static,
{
    let publisher = Arc::new(CountingPublisher::noop(BATCH));
    let config = relay_run::config(BATCH, Ordering::PerKey);
    relay_run::drain(store, publisher, config, 1, n as u64).await
}
