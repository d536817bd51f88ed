//! What enqueueing costs the business transaction: one `UPDATE invoices`
//! with and without one event, the same with one event into PgQ
//! (`pgq.insert_event`, the cost to match), and one transaction of 40,000
//! events.

use std::time::Instant;

use outbox_core::NewEvent;
use sqlx::Executor;

use super::{Rounds, Scale, progress};
use crate::env::{self, Error};
use crate::pgq;
use crate::report::{Report, TargetCheck};

/// Scenario name.
pub const NAME: &str = "enqueue-postgres";
const INVOICES: i64 = 10_000;
const BULK: usize = 40_000;
/// The business transaction alone.
const UPDATE_ONLY: &str = "update-only";
/// With one event through the store's enqueue.
const UPDATE_EVENT: &str = "update+event";
/// With one event through `pgq.insert_event`.
const UPDATE_PGQ: &str = "update+pgq-event";

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let transactions = scale.pick(5_000, 300);
    let pool = env::pg_pool(4).await?;
    let store = env::pg_store(&pool).await?;
    pgq::install(&pool).await?;
    pool.execute(&*format!(
        "CREATE TABLE IF NOT EXISTS bench_invoices (id BIGINT PRIMARY KEY, status TEXT NOT NULL, amount_cents BIGINT NOT NULL);
         TRUNCATE bench_invoices;
         INSERT INTO bench_invoices SELECT i, 'open', 1000 FROM generate_series(1, {INVOICES}) AS i;
         ANALYZE bench_invoices;"
    ))
    .await?;
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        env::pg_reset(&pool).await?;
        pgq::reset(&pool, 1_000).await?;
        // Interleaved a transaction at a time, each contender first in
        // turn: a checkpoint, autovacuum or a neighbour's burst falls on
        // all three alike (run as blocks of 5,000 one after another, the
        // last block's share of such noise decided the ratio).
        let contenders = [UPDATE_ONLY, UPDATE_EVENT, UPDATE_PGQ];
        let mut spent = [std::time::Duration::ZERO; 3];
        // Each transaction's time as well: the mean carries a checkpoint or
        // a neighbour's burst whole, the median does not.
        let mut each: [Vec<f64>; 3] = Default::default();
        for i in 0..transactions {
            let id = (i as i64 % INVOICES) + 1;
            for turn in 0..contenders.len() {
                let which = (i + turn) % contenders.len();
                let event = env::event(round, i);
                let started = Instant::now();
                let mut tx = pool.begin().await?;
                sqlx::query("UPDATE bench_invoices SET status = 'paid', amount_cents = amount_cents + 1 WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                match contenders[which] {
                    UPDATE_EVENT => {
                        store.enqueue(&mut tx, std::slice::from_ref(&event)).await?;
                    }
                    UPDATE_PGQ => pgq::insert_events(&mut tx, std::slice::from_ref(&event)).await?,
                    _ => {}
                }
                tx.commit().await?;
                let took = started.elapsed();
                spent[which] += took;
                each[which].push(took.as_secs_f64() * 1e6);
            }
        }
        let mut p50 = [0.0; 3];
        for (i, (name, spent)) in contenders.iter().zip(spent).enumerate() {
            let micros = spent.as_secs_f64() * 1e6 / transactions as f64;
            p50[i] = median(&mut each[i]);
            rounds.add(name, "µs/txn", micros, false);
            rounds.add(name, "p50 µs/txn", p50[i], false);
            progress(format!(
                "round {round} {name}: {micros:.0} µs per transaction, p50 {:.0}",
                p50[i]
            ));
        }
        // The same ratio as the target's, of this round's medians.
        let at = |name: &str| {
            p50[contenders
                .iter()
                .position(|c| *c == name)
                .expect("a contender")]
        };
        rounds.add(
            "ours / PgQ, medians",
            "ratio",
            at(UPDATE_EVENT) / at(UPDATE_PGQ),
            false,
        );
        let written: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_events")
            .fetch_one(&pool)
            .await?;
        let queued = pgq::events_in_queue(&pool).await?;
        if written != transactions as i64 || queued != transactions as i64 {
            return Err(
                format!("{written} of {transactions} events written, {queued} into PgQ").into(),
            );
        }
        if scale.includes("bulk") {
            env::pg_reset(&pool).await?;
            let events: Vec<NewEvent> = (0..BULK).map(|i| env::event(round, i)).collect();
            let started = Instant::now();
            let mut tx = pool.begin().await?;
            let outcomes = store.enqueue(&mut tx, &events).await?;
            tx.commit().await?;
            let seconds = started.elapsed().as_secs_f64();
            if outcomes.len() != BULK {
                return Err("bulk enqueue lost outcomes".into());
            }
            rounds.add("bulk-40k", "seconds", seconds, false);
            progress(format!("round {round} bulk 40,000: {seconds:.3} s"));
        }
    }
    rounds.finish(NAME, report);
    let m =
        |report: &Report, c: &str, metric: &str| report.median(NAME, c, metric).unwrap_or(f64::NAN);
    let with_event = m(report, UPDATE_EVENT, "µs/txn");
    report.target(TargetCheck::at_most(
        "enqueue: business txn with one event / with one pgq.insert_event",
        with_event / m(report, UPDATE_PGQ, "µs/txn"),
        1.1,
    ));
    report.target(TargetCheck::at_most(
        "enqueue: business txn with / without one event",
        with_event / m(report, UPDATE_ONLY, "µs/txn"),
        1.25,
    ));
    let bulk = m(report, "bulk-40k", "seconds");
    report.target(TargetCheck::at_most(
        "enqueue: 40,000 events in one transaction, s",
        bulk,
        1.0,
    ));
    pool.close().await;
    Ok(())
}

/// The median of `values` (sorted in place).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}
