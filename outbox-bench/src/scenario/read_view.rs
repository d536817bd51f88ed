//! MariaDB's drain while another session holds a read view (a
//! `mysqldump --single-transaction`, a report, an idle `BEGIN` that read a
//! table) for the whole drain, against the same drain with none: InnoDB
//! cannot purge the index entries each lease and ack delete-marks while
//! the view is open, and a claim that steps over them slows as the drain
//! goes on. Per-key relay with the default batch (256), 1,000 keys, no-op publisher.

use std::sync::Arc;

use outbox_core::Ordering;
use sqlx::Connection;

use super::{Rounds, Scale, progress, rate};
use crate::counting::CountingPublisher;
use crate::env::{self, Error};
use crate::relay_run;
use crate::report::{Report, TargetCheck};

/// Scenario name.
pub const NAME: &str = "read-view-mariadb";
const BATCH: usize = 256;

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let n = scale.pick(100_000, 2_000);
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        for contender in ["none", "read-view-held"] {
            if !scale.includes(contender) {
                continue;
            }
            let store = Arc::new(env::mysql_store(8).await?);
            env::mysql_reset(&store).await?;
            env::fill_writer(store.as_ref(), n, |i| env::event(round, i)).await?;
            // Another session's consistent snapshot, taken before the drain
            // and kept until it ends.
            let mut view = if contender == "read-view-held" {
                let mut other = sqlx::MySqlConnection::connect(&format!(
                    "{}/{}",
                    env::mysql_server(),
                    env::DATABASE
                ))
                .await?;
                sqlx::Executor::execute(&mut other, "START TRANSACTION WITH CONSISTENT SNAPSHOT")
                    .await?;
                sqlx::query("SELECT count(*) FROM bench_events")
                    .execute(&mut other)
                    .await?;
                Some(other)
            } else {
                None
            };
            let publisher = Arc::new(CountingPublisher::noop(BATCH));
            let elapsed = relay_run::drain(
                store.clone(),
                publisher,
                relay_run::config(BATCH, Ordering::PerKey),
                1,
                n as u64,
            )
            .await?;
            if let Some(mut other) = view.take() {
                sqlx::Executor::execute(&mut other, "ROLLBACK").await?;
                other.close().await?;
            }
            store.pool().close().await;
            rounds.add(contender, "events/s", rate(n as u64, elapsed), true);
            progress(format!(
                "round {round} {contender}: {:.0} events/s",
                rate(n as u64, elapsed)
            ));
        }
    }
    rounds.finish(NAME, report);
    let m = |c: &str| report.median(NAME, c, "events/s").unwrap_or(f64::NAN);
    let ratio = m("read-view-held") / m("none");
    report.target(TargetCheck::at_least(
        "mariadb drain: a read view held the whole drain / none",
        ratio,
        0.8,
    ));
    Ok(())
}
