//! [`OutboxAdmin`] on PostgreSQL: lag, failures, blocked keys, operator actions.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::clock::elapsed_between;
use outbox_core::store::{
    AttemptKind, AttemptRecord, BlockedKey, EnqueueOutcome, EventState, EventTypeStats,
    FailedEvent, OperatorAction, OutboxAdmin, RelayStatus,
};
use outbox_core::{EventId, NewEvent, StoreError};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::row;
use super::store::PgStore;
use crate::codes;
use crate::error::ResultExt;
use crate::validate::{check_event, headers_json};

impl PgStore {
    /// `NotFound` or `WrongState` for an operator action that matched no row.
    async fn record_action(
        &self,
        conn: &mut sqlx::PgConnection,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
        detail: &str,
        attempts: i32,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.queries.record)
            .bind(event_id.as_uuid())
            .bind(codes::attempt_kind_code(kind))
            .bind(self.config.clock.now())
            .bind(&action.operator)
            .bind(detail)
            .bind(attempts)
            .execute(conn)
            .await
            .store()?;
        Ok(())
    }

    /// Runs an operator update that returns `attempts`, then records it.
    async fn operator_update(
        &self,
        query: &str,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
        with_now: bool,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.store()?;
        let mut update = sqlx::query(query).bind(event_id.as_uuid());
        if with_now {
            update = update.bind(self.config.clock.now());
        }
        let Some(row) = update.fetch_optional(&mut *tx).await.store()? else {
            drop(tx);
            return Err(crate::admin_common::explain_miss(self, event_id).await);
        };
        let attempts: i32 = row.try_get("attempts").store()?;
        self.record_action(&mut tx, event_id, kind, action, &action.reason, attempts)
            .await?;
        tx.commit().await.store()
    }
}

fn event_state(row: &PgRow) -> Result<EventState, StoreError> {
    let status: i16 = row.try_get("status").store()?;
    let attempts: i32 = row.try_get("attempts").store()?;
    Ok(match status {
        codes::PENDING => EventState::Pending {
            available_at: row.try_get("available_at").store()?,
            attempts: attempts as u32,
        },
        codes::IN_FLIGHT => EventState::InFlight {
            owner: row
                .try_get::<Option<String>, _>("lease_owner")
                .store()?
                .unwrap_or_default(),
            lease_expires_at: row.try_get("lease_expires_at").store()?,
        },
        codes::PUBLISHED => EventState::Published {
            published_at: row.try_get("published_at").store()?,
        },
        _ => EventState::Failed {
            blocks_key: row.try_get("blocks_key").store()?,
            superseded_by: row
                .try_get::<Option<Uuid>, _>("superseded_by")
                .store()?
                .map(EventId::from_uuid),
        },
    })
}

#[async_trait]
impl OutboxAdmin for PgStore {
    async fn stats(&self) -> Result<Vec<EventTypeStats>, StoreError> {
        let now = self.config.clock.now();
        let rows = sqlx::query(&self.queries.stats)
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .store()?;
        rows.iter()
            .map(|r| {
                let oldest: Option<DateTime<Utc>> = r.try_get("oldest").store()?;
                let count = |c: &str| r.try_get::<i64, _>(c).map(|n| n as u64).store();
                Ok(EventTypeStats {
                    event_type: r.try_get("event_type").store()?,
                    claimable: count("claimable")?,
                    oldest_claimable_age: oldest.map(|t| elapsed_between(now, t)),
                    parked: count("parked")?,
                    in_flight: count("in_flight")?,
                    failed: count("failed")?,
                })
            })
            .collect()
    }

    async fn event_state(&self, event_id: EventId) -> Result<Option<EventState>, StoreError> {
        let row = sqlx::query(&self.queries.event_state)
            .bind(event_id.as_uuid())
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
        let ids: Vec<Uuid> = rows
            .iter()
            .map(|r| r.try_get("event_id"))
            .collect::<Result<_, _>>()
            .store()?;
        let mut histories: HashMap<EventId, Vec<AttemptRecord>> = HashMap::new();
        for r in sqlx::query(&self.queries.history_many)
            .bind(&ids)
            .fetch_all(&self.pool)
            .await
            .store()?
        {
            let (id, record) = row::attempt_record(&r)?;
            histories.entry(id).or_default().push(record);
        }
        rows.iter()
            .map(|r| {
                let event = row::stored_event(r)?;
                Ok(FailedEvent {
                    history: histories.remove(&event.event_id).unwrap_or_default(),
                    blocks_key: r.try_get("blocks_key").store()?,
                    superseded_by: r
                        .try_get::<Option<Uuid>, _>("superseded_by")
                        .store()?
                        .map(EventId::from_uuid),
                    event,
                })
            })
            .collect()
    }

    async fn history(&self, event_id: EventId) -> Result<Vec<AttemptRecord>, StoreError> {
        if self.event_state(event_id).await?.is_none() {
            return Err(StoreError::NotFound(event_id));
        }
        sqlx::query(&self.queries.history)
            .bind(event_id.as_uuid())
            .fetch_all(&self.pool)
            .await
            .store()?
            .iter()
            .map(|r| row::attempt_record(r).map(|(_, record)| record))
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
                    blocking_event_id: EventId::from_uuid(r.try_get("event_id").store()?),
                    backlog: r.try_get::<i64, _>("backlog").store()? as u64,
                })
            })
            .collect()
    }

    async fn requeue(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        let query = self.queries.requeue.clone();
        self.operator_update(&query, event_id, AttemptKind::Requeued, action, true)
            .await
    }

    async fn skip(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        let query = self.queries.skip.clone();
        self.operator_update(&query, event_id, AttemptKind::Skipped, action, false)
            .await
    }

    async fn supersede(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        check_event(&replacement, &self.config.limits, true)?;
        let now = self.config.clock.now();
        let mut tx = self.pool.begin().await.store()?;
        let Some(old) = sqlx::query(&self.queries.supersede_lock)
            .bind(event_id.as_uuid())
            .fetch_optional(&mut *tx)
            .await
            .store()?
        else {
            drop(tx);
            return Err(crate::admin_common::explain_miss(self, event_id).await);
        };
        let order_xid: String = old.try_get("order_xid").store()?;
        let ord: i64 = old.try_get("ord").store()?;
        let attempts: i32 = old.try_get("attempts").store()?;
        let inserted = sqlx::query(&self.queries.supersede_insert)
            .bind(order_xid)
            .bind(ord)
            .bind(replacement.event_id.as_uuid())
            .bind(&replacement.aggregate_type)
            .bind(&replacement.aggregate_id)
            .bind(&replacement.event_type)
            .bind(&replacement.partition_key)
            .bind(replacement.payload.as_str())
            .bind(replacement.payload_version as i32)
            .bind(headers_json(&replacement))
            .bind(now)
            .bind(replacement.available_at)
            .fetch_optional(&mut *tx)
            .await
            .store()?;
        let Some(inserted) = inserted else {
            return Ok(EnqueueOutcome::AlreadyExists);
        };
        sqlx::query(&self.queries.supersede_mark)
            .bind(event_id.as_uuid())
            .bind(replacement.event_id.as_uuid())
            .execute(&mut *tx)
            .await
            .store()?;
        let detail = format!("superseded by {}: {}", replacement.event_id, action.reason);
        self.record_action(
            &mut tx,
            event_id,
            AttemptKind::Superseded,
            action,
            &detail,
            attempts,
        )
        .await?;
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
        let purged: i64 = sqlx::query_scalar(&self.queries.purge)
            .bind(cutoff)
            .bind(batch_size.min(i64::MAX as usize) as i64)
            .fetch_one(&self.pool)
            .await
            .store()?;
        if (purged as u64) < batch_size as u64 {
            // Nothing the cutoff allows is left: older cursor-log entries
            // describe no row any more.
            sqlx::query(&self.queries.prune_cursor_log)
                .bind(cutoff)
                .execute(&self.pool)
                .await
                .store()?;
        }
        Ok(purged as u64)
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
                    last_seen: r.try_get("last_seen").store()?,
                })
            })
            .collect()
    }
}
