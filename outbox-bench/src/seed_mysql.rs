//! The seed's relay on MariaDB/MySQL, as [`crate::seed`] has it on
//! PostgreSQL: same statements in MariaDB's dialect, same driver (sqlx),
//! same database as the store. InnoDB, the server's default isolation
//! (REPEATABLE READ), `FOR UPDATE SKIP LOCKED` (MariaDB 10.6+, MySQL 8).
//!
//! * `seed-per-row`: claim 200 oldest pending rows, publish each, one
//!   `UPDATE` per row, commit.
//! * `seed-batched`: the same with one `UPDATE … WHERE id IN (…)` per batch.

use std::sync::Arc;

use outbox_core::Publisher;
use sqlx::{Executor, MySqlPool, Row};

use crate::env::{Error, KEYS};
use crate::seed::{Baseline, SEED_BATCH, stored_event};

/// Creates the seed's table if missing and fills it with `n` pending
/// events shaped like the relay's (same payload size and keys).
pub async fn fill(pool: &MySqlPool, n: usize) -> Result<(), Error> {
    pool.execute(
        "CREATE TABLE IF NOT EXISTS seed_outbox (
             id             BIGINT AUTO_INCREMENT PRIMARY KEY,
             aggregate_type VARCHAR(255) NOT NULL,
             aggregate_id   VARCHAR(255) NOT NULL,
             event_type     VARCHAR(255) NOT NULL,
             partition_key  VARCHAR(255) NOT NULL,
             payload        LONGTEXT NOT NULL,
             status         VARCHAR(16) NOT NULL DEFAULT 'pending',
             created_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
             sent_at        DATETIME(6) NULL,
             INDEX seed_outbox_status (status, created_at)
         ) ENGINE = InnoDB",
    )
    .await?;
    pool.execute("TRUNCATE seed_outbox").await?;
    // Chunks keep each statement's row count modest; MariaDB's sequence
    // engine (`seq_0_to_N`) generates the numbers.
    for start in (0..n).step_by(10_000) {
        let end = (start + 10_000).min(n) - 1;
        pool.execute(&*format!(
            "INSERT INTO seed_outbox (aggregate_type, aggregate_id, event_type, partition_key, payload)
             SELECT 'invoice', CONCAT('inv-', seq), 'invoice.paid', CONCAT('sub-', seq % {KEYS}),
                    JSON_OBJECT('invoice_id', CONCAT('inv-', seq),
                                'subscription_id', CONCAT('sub-', seq % {KEYS}),
                                'amount_cents', 1000 + seq % 9000, 'currency', 'EUR')
             FROM seq_{start}_to_{end}"
        ))
        .await?;
    }
    pool.execute("ANALYZE TABLE seed_outbox").await?;
    Ok(())
}

/// Rows the seed table still has pending.
pub async fn pending(pool: &MySqlPool) -> Result<i64, Error> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM seed_outbox WHERE status <> 'sent'")
            .fetch_one(pool)
            .await?,
    )
}

/// Runs `workers` seed relays until the table is drained.
pub async fn drain(
    pool: &MySqlPool,
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

async fn worker(
    pool: &MySqlPool,
    baseline: Baseline,
    publisher: &dyn Publisher,
) -> Result<(), Error> {
    loop {
        let mut tx = pool.begin().await?;
        let rows = sqlx::query(
            "SELECT id, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at
             FROM seed_outbox WHERE status = 'pending'
             ORDER BY created_at LIMIT ? FOR UPDATE SKIP LOCKED",
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
            let created_at: chrono::NaiveDateTime = row.try_get("created_at")?;
            let event = stored_event(
                id,
                row.try_get("event_type")?,
                row.try_get("aggregate_type")?,
                row.try_get("aggregate_id")?,
                row.try_get("partition_key")?,
                row.try_get("payload")?,
                created_at.and_utc(),
            )?;
            if let Some(Err(error)) = publisher.publish(&[&event]).await.pop() {
                return Err(error.to_string().into());
            }
            match baseline {
                Baseline::PerRow => {
                    sqlx::query(
                        "UPDATE seed_outbox SET status = 'sent', sent_at = NOW(6) WHERE id = ?",
                    )
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                }
                Baseline::Batched => sent.push(id.to_string()),
            }
        }
        if !sent.is_empty() {
            // Integers the harness read itself: inlined, no binding per id.
            tx.execute(&*format!(
                "UPDATE seed_outbox SET status = 'sent', sent_at = NOW(6) WHERE id IN ({})",
                sent.join(",")
            ))
            .await?;
        }
        tx.commit().await?;
    }
}
