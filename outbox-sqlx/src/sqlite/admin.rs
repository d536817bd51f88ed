//! [`OutboxAdmin`] on SQLite.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::clock::elapsed_between;
use outbox_core::store::{
    AttemptKind, AttemptRecord, BlockedKey, EnqueueOutcome, EventState, EventTypeStats,
    FailedEvent, OperatorAction, OutboxAdmin, RelayStatus,
};
use outbox_core::{EventId, NewEvent, StoreError};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::row::{self, micros};
use super::store::SqliteStore;
use crate::codes;
use crate::error::ResultExt;
use crate::history::HistoryEntry;
use crate::validate::{check_event, headers_json};

impl SqliteStore {
    async fn operator_update(
        &self,
        query: &str,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        let row = sqlx::query(query)
            .bind(event_id.to_string())
            .bind(micros(self.config.clock.now()))
            .fetch_optional(&mut *tx)
            .await
            .store()?;
        let Some(row) = row else {
            drop(tx);
            return Err(crate::admin_common::explain_miss(self, event_id).await);
        };
        let attempts: i64 = row.try_get("attempts").store()?;
        let entry = HistoryEntry {
            event_id,
            kind,
            actor: action.operator.as_str(),
            error_class: None,
            detail: action.reason.as_str(),
            attempts,
        };
        self.record(&mut tx, &[entry]).await?;
        tx.commit().await.store()
    }
}

fn event_state(r: &SqliteRow) -> Result<EventState, StoreError> {
    let status: i64 = r.try_get("status").store()?;
    let attempts: i64 = r.try_get("attempts").store()?;
    Ok(match status as i16 {
        codes::PENDING => EventState::Pending {
            available_at: row::time(r, "available_at")?,
            attempts: attempts as u32,
        },
        codes::IN_FLIGHT => EventState::InFlight {
            owner: r
                .try_get::<Option<String>, _>("lease_owner")
                .store()?
                .unwrap_or_default(),
            lease_expires_at: row::time(r, "lease_expires_at")?,
        },
        codes::PUBLISHED => EventState::Published {
            published_at: row::time(r, "published_at")?,
        },
        _ => EventState::Failed {
            blocks_key: r.try_get("blocks_key").store()?,
            superseded_by: superseded_by(r)?,
        },
    })
}

fn superseded_by(r: &SqliteRow) -> Result<Option<EventId>, StoreError> {
    let text: Option<String> = r.try_get("superseded_by").store()?;
    text.map(|t| t.parse().map_err(StoreError::fatal))
        .transpose()
}

#[async_trait]
impl OutboxAdmin for SqliteStore {
    async fn stats(&self) -> Result<Vec<EventTypeStats>, StoreError> {
        let now = self.config.clock.now();
        let rows = sqlx::query(&self.queries.stats)
            .bind(micros(now))
            .fetch_all(&self.pool)
            .await
            .store()?;
        rows.iter()
            .map(|r| {
                let oldest: Option<i64> = r.try_get("oldest").store()?;
                let count = |c: &str| r.try_get::<i64, _>(c).map(|n| n as u64).store();
                Ok(EventTypeStats {
                    event_type: r.try_get("event_type").store()?,
                    claimable: count("claimable")?,
                    oldest_claimable_age: oldest
                        .map(row::from_micros)
                        .transpose()?
                        .map(|t| elapsed_between(now, t)),
                    parked: count("parked")?,
                    in_flight: count("in_flight")?,
                    failed: count("failed")?,
                })
            })
            .collect()
    }

    async fn event_state(&self, event_id: EventId) -> Result<Option<EventState>, StoreError> {
        let row = sqlx::query(&self.queries.event_state)
            .bind(event_id.to_string())
            .fetch_optional(&self.pool)
            .await
            .store()?;
        row.as_ref().map(event_state).transpose()
    }

    async fn failed_events(&self, limit: usize) -> Result<Vec<FailedEvent>, StoreError> {
        let rows = sqlx::query(&self.queries.failed_events)
            .bind(limit.min(i64::MAX as usize) as i64)
            .fetch_all(&self.pool)
            .await
            .store()?;
        let mut failed = Vec::with_capacity(rows.len());
        for r in &rows {
            let event = row::stored_event(r)?;
            failed.push(FailedEvent {
                history: self.history(event.event_id).await?,
                blocks_key: r.try_get("blocks_key").store()?,
                superseded_by: superseded_by(r)?,
                event,
            });
        }
        Ok(failed)
    }

    async fn history(&self, event_id: EventId) -> Result<Vec<AttemptRecord>, StoreError> {
        if self.event_state(event_id).await?.is_none() {
            return Err(StoreError::NotFound(event_id));
        }
        sqlx::query(&self.queries.history)
            .bind(event_id.to_string())
            .fetch_all(&self.pool)
            .await
            .store()?
            .iter()
            .map(row::attempt_record)
            .collect()
    }

    async fn blocked_keys(&self) -> Result<Vec<BlockedKey>, StoreError> {
        sqlx::query(&self.queries.blocked_keys)
            .fetch_all(&self.pool)
            .await
            .store()?
            .iter()
            .map(|r| {
                Ok(BlockedKey {
                    partition_key: r.try_get("partition_key").store()?,
                    blocking_event_id: row::event_id(r, "event_id")?,
                    backlog: r.try_get::<i64, _>("backlog").store()? as u64,
                })
            })
            .collect()
    }

    async fn requeue(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        let query = self.queries.requeue.clone();
        self.operator_update(&query, event_id, AttemptKind::Requeued, action)
            .await
    }

    async fn skip(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        let query = self.queries.skip.clone();
        self.operator_update(&query, event_id, AttemptKind::Skipped, action)
            .await
    }

    async fn supersede(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        check_event(&replacement, &self.config.limits, false)?;
        let now = micros(self.config.clock.now());
        let mut tx = self.begin_immediate().await?;
        let Some(old) = sqlx::query(&self.queries.supersede_lock)
            .bind(event_id.to_string())
            .fetch_optional(&mut *tx)
            .await
            .store()?
        else {
            drop(tx);
            return Err(crate::admin_common::explain_miss(self, event_id).await);
        };
        let ord: i64 = old.try_get("ord_key").store()?;
        let attempts: i64 = old.try_get("attempts").store()?;
        let inserted = sqlx::query(&self.queries.supersede_insert)
            .bind(ord)
            .bind(replacement.event_id.to_string())
            .bind(&replacement.aggregate_type)
            .bind(&replacement.aggregate_id)
            .bind(&replacement.event_type)
            .bind(&replacement.partition_key)
            .bind(replacement.payload.as_str())
            .bind(i64::from(replacement.payload_version))
            .bind(headers_json(&replacement))
            .bind(now)
            .bind(replacement.available_at.map(micros))
            .fetch_optional(&mut *tx)
            .await
            .store()?;
        let Some(inserted) = inserted else {
            return Ok(EnqueueOutcome::AlreadyExists);
        };
        sqlx::query(&self.queries.supersede_mark)
            .bind(event_id.to_string())
            .bind(replacement.event_id.to_string())
            .execute(&mut *tx)
            .await
            .store()?;
        let detail = format!("superseded by {}: {}", replacement.event_id, action.reason);
        let entry = HistoryEntry {
            event_id,
            kind: AttemptKind::Superseded,
            actor: action.operator.as_str(),
            error_class: None,
            detail: detail.as_str(),
            attempts,
        };
        self.record(&mut tx, &[entry]).await?;
        tx.commit().await.store()?;
        Ok(EnqueueOutcome::Inserted {
            sequence: inserted.try_get("sequence").store()?,
        })
    }

    async fn purge_published(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        let cutoff = self.config.clock.now()
            - chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
        let limit = batch_size.min(i64::MAX as usize) as i64;
        let mut tx = self.begin_immediate().await?;
        sqlx::query(&self.queries.purge_history)
            .bind(micros(cutoff))
            .bind(limit)
            .execute(&mut *tx)
            .await
            .store()?;
        let done = sqlx::query(&self.queries.purge)
            .bind(micros(cutoff))
            .bind(limit)
            .execute(&mut *tx)
            .await
            .store()?;
        tx.commit().await.store()?;
        Ok(done.rows_affected())
    }

    async fn relays(&self) -> Result<Vec<RelayStatus>, StoreError> {
        sqlx::query(&self.queries.relays)
            .fetch_all(&self.pool)
            .await
            .store()?
            .iter()
            .map(|r| {
                Ok(RelayStatus {
                    relay: r.try_get("relay").store()?,
                    last_seen: row::time(r, "last_seen")?,
                })
            })
            .collect()
    }
}
