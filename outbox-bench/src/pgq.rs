//! PgQ, the Skype queue (Debian's `postgresql-15-pgq3`, installed by
//! `scripts/pgq.sh`), as a contender on the same database, driver and pool
//! as the relay. What it does:
//!
//! * **Enqueue**: `pgq.insert_event` per event, one row into the queue's
//!   current event table (no index but the event id's, no trigger).
//! * **Ticks**: `pgq.ticker(queue)` records a snapshot (txid_current's
//!   snapshot) when enough events (`ticker_max_count`) or time has passed;
//!   `pgqd` calls it every second. Here it is called after each producer
//!   transaction commits, as `pgqd` would with `ticker_max_count` = the
//!   transaction's size: one tick per 1,000 events.
//! * **A batch** is the events between two ticks' snapshots: `next_batch`
//!   (one row in `pgq.subscription`), `get_batch_events` (one query
//!   reading the event table by txid range and snapshot), `finish_batch`
//!   (one row update). Nothing is written per event after its insert.
//!
//! What it does not do, and the relay does: per-key order across
//! consumers, leases and fencing, per-event retries and blame (a PgQ
//! consumer retries or fails a whole batch), parking, failing an event
//! alone, status per event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::consume::pause_unless_shut_down;
use outbox_core::event::StoredEvent;
use outbox_core::{CancellationToken, NewEvent, Publisher};
use sqlx::{Executor, PgPool, Row};
use tokio::task::JoinHandle;

use crate::env::Error;

/// The queue the contenders use (dropped and created each round).
pub const QUEUE: &str = "outbox_bench";
/// The one consumer registered on it.
const CONSUMER: &str = "bench_consumer";

/// `CREATE EXTENSION pgq` in the bench database, with a clear error where
/// the package is missing.
pub async fn install(pool: &PgPool) -> Result<(), Error> {
    match pool.execute("CREATE EXTENSION IF NOT EXISTS pgq").await {
        Ok(_) => Ok(()),
        Err(error) => Err(format!(
            "PgQ is not installed ({error}); scripts/pgq.sh installs it (scripts/services.sh runs it)"
        )
        .into()),
    }
}

/// A fresh queue that ticks every `per_tick` events, with the consumer
/// registered at its start.
pub async fn reset(pool: &PgPool, per_tick: usize) -> Result<(), Error> {
    sqlx::query("SELECT pgq.unregister_consumer($1, $2) FROM pgq.queue WHERE queue_name = $1")
        .bind(QUEUE)
        .bind(CONSUMER)
        .execute(pool)
        .await?;
    sqlx::query("SELECT pgq.drop_queue($1) FROM pgq.queue WHERE queue_name = $1")
        .bind(QUEUE)
        .execute(pool)
        .await?;
    sqlx::query("SELECT pgq.create_queue($1)")
        .bind(QUEUE)
        .execute(pool)
        .await?;
    sqlx::query("SELECT pgq.set_queue_config($1, 'ticker_max_count', $2)")
        .bind(QUEUE)
        .bind(per_tick.to_string())
        .execute(pool)
        .await?;
    sqlx::query("SELECT pgq.register_consumer($1, $2)")
        .bind(QUEUE)
        .bind(CONSUMER)
        .execute(pool)
        .await?;
    Ok(())
}

/// Enqueues `n` events shaped like the relay's (payload, key, id) with
/// `pgq.insert_event`, `per_transaction` a transaction, ticking after each
/// commit as `pgqd` would.
pub async fn fill(
    pool: &PgPool,
    n: usize,
    per_transaction: usize,
    event: impl Fn(usize) -> outbox_core::NewEvent,
) -> Result<(), Error> {
    for start in (0..n).step_by(per_transaction) {
        let events: Vec<_> = (start..(start + per_transaction).min(n))
            .map(&event)
            .collect();
        let mut tx = pool.begin().await?;
        insert_events(&mut tx, &events).await?;
        tx.commit().await?;
        tick(pool).await?;
    }
    Ok(())
}

/// `pgq.insert_event` for each of `events` in the caller's transaction:
/// type, payload, the key (`ev_extra1`), the event id (`ev_extra2`).
pub async fn insert_events(
    conn: &mut sqlx::PgConnection,
    events: &[outbox_core::NewEvent],
) -> Result<(), Error> {
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let payloads: Vec<&str> = events.iter().map(|e| e.payload.as_str()).collect();
    let keys: Vec<&str> = events.iter().map(|e| e.partition_key.as_str()).collect();
    let ids: Vec<String> = events.iter().map(|e| e.event_id.to_string()).collect();
    sqlx::query(
        "SELECT pgq.insert_event($1, t, d, k, i, NULL, NULL)
         FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS u(t, d, k, i)",
    )
    .bind(QUEUE)
    .bind(&types)
    .bind(&payloads)
    .bind(&keys)
    .bind(&ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// Events in the queue's tables (every one inserted since [`reset`]: the
/// event tables inherit from the queue's data table).
pub async fn events_in_queue(pool: &PgPool) -> Result<i64, Error> {
    let table: String =
        sqlx::query_scalar("SELECT queue_data_pfx FROM pgq.queue WHERE queue_name = $1")
            .bind(QUEUE)
            .fetch_one(pool)
            .await?;
    let count = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await?;
    Ok(count)
}

/// What `pgqd` does each period: a tick if the queue's thresholds say so.
pub async fn tick(pool: &PgPool) -> Result<(), Error> {
    sqlx::query("SELECT pgq.ticker($1)")
        .bind(QUEUE)
        .execute(pool)
        .await?;
    Ok(())
}

/// One consumer: batches until `expected` events were published to
/// `publisher` (each batch read with one query and handed over whole, as
/// the relay hands over its claims); returns the time it took.
pub async fn drain(
    pool: &PgPool,
    publisher: Arc<dyn Publisher>,
    expected: u64,
) -> Result<Duration, Error> {
    let started = Instant::now();
    let mut consumed = 0u64;
    while consumed < expected {
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("pgq consumer: {consumed} of {expected} after 600 s").into());
        }
        match consume_batch(pool, publisher.as_ref()).await? {
            Some(events) => consumed += events as u64,
            None => {
                // The last events are past the last tick: force one.
                sqlx::query("SELECT pgq.force_tick($1)")
                    .bind(QUEUE)
                    .execute(pool)
                    .await?;
                tick(pool).await?;
            }
        }
    }
    Ok(started.elapsed())
}

/// `pgqd`'s ticker: [`tick`] every `period` until `shutdown`.
pub fn spawn_ticker(
    pool: PgPool,
    period: Duration,
    shutdown: CancellationToken,
) -> JoinHandle<Result<(), Error>> {
    tokio::spawn(async move {
        while !shutdown.is_cancelled() {
            tick(&pool).await?;
            pause_unless_shut_down(period, &shutdown).await;
        }
        Ok(())
    })
}

/// A consumer that asks for the next batch every `poll` while there is
/// none, until `shutdown`.
pub fn spawn_consumer(
    pool: PgPool,
    publisher: Arc<dyn Publisher>,
    poll: Duration,
    shutdown: CancellationToken,
) -> JoinHandle<Result<(), Error>> {
    tokio::spawn(async move {
        while !shutdown.is_cancelled() {
            if consume_batch(&pool, publisher.as_ref()).await?.is_none() {
                pause_unless_shut_down(poll, &shutdown).await;
            }
        }
        Ok(())
    })
}

/// The next batch, if a tick closed one: read, published whole, finished.
/// Returns its events' count.
async fn consume_batch(pool: &PgPool, publisher: &dyn Publisher) -> Result<Option<usize>, Error> {
    let batch: Option<i64> = sqlx::query_scalar("SELECT pgq.next_batch($1, $2)")
        .bind(QUEUE)
        .bind(CONSUMER)
        .fetch_one(pool)
        .await?;
    let Some(batch) = batch else {
        return Ok(None);
    };
    let rows = sqlx::query(
        "SELECT ev_id, ev_time, ev_type, ev_data, ev_extra1, ev_extra2
         FROM pgq.get_batch_events($1)",
    )
    .bind(batch)
    .fetch_all(pool)
    .await?;
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        events.push(stored_event(row)?);
    }
    let refs: Vec<_> = events.iter().collect();
    for result in publisher.publish(&refs).await {
        result.map_err(|e| e.to_string())?;
    }
    sqlx::query("SELECT pgq.finish_batch($1)")
        .bind(batch)
        .execute(pool)
        .await?;
    Ok(Some(rows.len()))
}

/// The event a queue row holds, as the relay would hand it to its
/// publisher (its id from `ev_extra2`, its key from `ev_extra1`).
fn stored_event(row: &sqlx::postgres::PgRow) -> Result<StoredEvent, Error> {
    let id: String = row.try_get("ev_extra2")?;
    let created_at = row.try_get("ev_time")?;
    let event = NewEvent::builder(row.try_get::<String, _>("ev_type")?, "invoice", "pgq")
        .event_id(id.parse()?)
        .partition_key(row.try_get::<String, _>("ev_extra1")?)
        .payload_json(row.try_get::<String, _>("ev_data")?)
        .build()?;
    Ok(StoredEvent {
        sequence: row.try_get("ev_id")?,
        event,
        created_at,
        available_at: created_at,
        attempts: 0,
    })
}
