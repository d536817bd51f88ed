//! The baselines, on the same PostgreSQL database and driver as the relay.
//!
//! * `seed-per-row`: the seed's relay as written: in one transaction,
//!   `SELECT … WHERE status = 'pending' ORDER BY created_at LIMIT 200 FOR
//!   UPDATE SKIP LOCKED`, publish each row, one `UPDATE … status = 'sent'`
//!   per row, commit.
//! * `seed-batched`: the same with one `UPDATE … WHERE id = ANY($1)` per batch.
//! * `raw-floor`: no relay: the least work a durable outbox must do per
//!   event, marking the backlog sent in batches of 1,000 and reading each
//!   event's payload back (a relay must read what it publishes).
//!
//! The seed's table has the index its query needs, `(status, created_at)`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use outbox_core::event::StoredEvent;
use outbox_core::{NewEvent, Publisher};
use sqlx::{Executor, PgPool, Row};

use crate::env::{Error, KEYS};

/// Rows the seed claims per transaction.
pub const SEED_BATCH: i64 = 200;
/// Rows the floor marks per statement.
const FLOOR_BATCH: i64 = 1_000;

/// Which baseline.
#[derive(Clone, Copy, Debug)]
pub enum Baseline {
    /// One `UPDATE` per row.
    PerRow,
    /// One `UPDATE` per batch.
    Batched,
}

/// Creates the seed's table if missing and fills it with `n` pending events
/// shaped like the relay's (same payload size and keys).
pub async fn fill(pool: &PgPool, n: usize) -> Result<(), Error> {
    pool.execute(
        "CREATE TABLE IF NOT EXISTS seed_outbox (
             id             BIGSERIAL PRIMARY KEY,
             aggregate_type TEXT NOT NULL,
             aggregate_id   TEXT NOT NULL,
             event_type     TEXT NOT NULL,
             partition_key  TEXT NOT NULL,
             payload        JSONB NOT NULL,
             status         TEXT NOT NULL DEFAULT 'pending',
             created_at     TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
             sent_at        TIMESTAMPTZ
         );
         CREATE INDEX IF NOT EXISTS seed_outbox_status ON seed_outbox (status, created_at);
         TRUNCATE seed_outbox RESTART IDENTITY;",
    )
    .await?;
    sqlx::query(
        "INSERT INTO seed_outbox (aggregate_type, aggregate_id, event_type, partition_key, payload)
         SELECT 'invoice', 'inv-' || i, 'invoice.paid', 'sub-' || (i % $2),
                jsonb_build_object('invoice_id', 'inv-' || i, 'subscription_id', 'sub-' || (i % $2),
                                   'amount_cents', 1000 + i % 9000, 'currency', 'EUR')
         FROM generate_series(0, $1 - 1) AS i",
    )
    .bind(n as i64)
    .bind(KEYS as i64)
    .execute(pool)
    .await?;
    pool.execute("ANALYZE seed_outbox").await?;
    Ok(())
}

/// Rows the seed table still has pending.
pub async fn pending(pool: &PgPool) -> Result<i64, Error> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM seed_outbox WHERE status <> 'sent'")
            .fetch_one(pool)
            .await?,
    )
}

/// Runs `workers` seed relays until the table is drained.
pub async fn drain(
    pool: &PgPool,
    baseline: Baseline,
    workers: usize,
    publisher: Arc<dyn Publisher>,
) -> Result<(), Error> {
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let pool = pool.clone();
            let publisher = publisher.clone();
            tokio::spawn(async move { worker(&pool, baseline, publisher.as_ref()).await })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn worker(pool: &PgPool, baseline: Baseline, publisher: &dyn Publisher) -> Result<(), Error> {
    loop {
        let mut tx = pool.begin().await?;
        let rows = sqlx::query(
            "SELECT id, aggregate_type, aggregate_id, event_type, partition_key, payload::text AS payload,
                    created_at
             FROM seed_outbox WHERE status = 'pending'
             ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(SEED_BATCH)
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(());
        }
        let mut sent = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: i64 = row.try_get("id")?;
            let event = stored_event_of(row)?;
            if let Some(Err(error)) = publisher.publish(&[&event]).await.pop() {
                return Err(error.to_string().into());
            }
            match baseline {
                Baseline::PerRow => {
                    sqlx::query(
                        "UPDATE seed_outbox SET status = 'sent', sent_at = now() WHERE id = $1",
                    )
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                }
                Baseline::Batched => sent.push(id),
            }
        }
        if !sent.is_empty() {
            sqlx::query(
                "UPDATE seed_outbox SET status = 'sent', sent_at = now() WHERE id = ANY($1)",
            )
            .bind(&sent)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
    }
}

fn stored_event_of(row: &sqlx::postgres::PgRow) -> Result<StoredEvent, Error> {
    stored_event(
        row.try_get("id")?,
        row.try_get("event_type")?,
        row.try_get("aggregate_type")?,
        row.try_get("aggregate_id")?,
        row.try_get("partition_key")?,
        row.try_get("payload")?,
        row.try_get("created_at")?,
    )
}

/// The event a seed row holds, as a relay would hand it to its publisher.
pub fn stored_event(
    id: i64,
    event_type: String,
    aggregate_type: String,
    aggregate_id: String,
    partition_key: String,
    payload: String,
    created_at: DateTime<Utc>,
) -> Result<StoredEvent, Error> {
    let event = NewEvent::builder(event_type, aggregate_type, aggregate_id)
        .event_id(outbox_core::EventId::random())
        .partition_key(partition_key)
        .payload_json(payload)
        .build()?;
    Ok(StoredEvent {
        sequence: id,
        event,
        created_at,
        available_at: created_at,
        attempts: 0,
    })
}

/// The floor: marks the backlog sent 1,000 rows per statement, reading
/// each payload back, until nothing is pending. Returns the rows marked.
pub async fn raw_floor(pool: &PgPool) -> Result<u64, Error> {
    let mut marked = 0u64;
    loop {
        let rows = sqlx::query(
            "UPDATE seed_outbox SET status = 'sent', sent_at = now()
             WHERE id IN (SELECT id FROM seed_outbox WHERE status = 'pending'
                          ORDER BY created_at LIMIT $1)
             RETURNING id, payload::text AS payload",
        )
        .bind(FLOOR_BATCH)
        .fetch_all(pool)
        .await?;
        if rows.is_empty() {
            return Ok(marked);
        }
        marked += rows.len() as u64;
    }
}
