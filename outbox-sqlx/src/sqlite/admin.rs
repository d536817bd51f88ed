//! [`OutboxAdmin`] on SQLite.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::clock::elapsed_between;
use outbox_core::store::{
    AttemptKind, AttemptRecord, BlockedKey, EnqueueOutcome, EventState, EventTypeStats,
    FailedEvent, HeldBack, OperatorAction, OutboxAdmin, RelayOutage, RelayStatus,
};
use outbox_core::{EventId, NewEvent, StoreError};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::row;
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
        self.sync_clock().await?;
        let mut tx = self.begin_immediate().await?;
        let now = self.now(&mut tx).await?;
        let row = sqlx::query(query)
            .bind(event_id.to_string())
            .bind(now)
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
        crate::error::during("stats", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let mut conn = self.pool.acquire().await.store()?;
            let now_us = self.now(&mut conn).await?;
            let now = row::from_micros(now_us)?;
            let rows = sqlx::query(&self.queries.stats)
                .bind(now_us)
                .fetch_all(&mut *conn)
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
                        blocked: count("blocked")?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn held_back(&self) -> Result<Vec<HeldBack>, StoreError> {
        crate::error::during("held_back", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let mut conn = self.pool.acquire().await.store()?;
            let now = self.now(&mut conn).await?;
            let r = sqlx::query(&self.queries.held_back)
                .bind(now)
                .fetch_one(&mut *conn)
                .await
                .store()?;
            let count = |c: &str| {
                r.try_get::<Option<i64>, _>(c)
                    .map(|n| n.unwrap_or(0) as u64)
                    .store()
            };
            let mut held = Vec::new();
            if count("blocked_keys")? > 0 {
                held.push(HeldBack::BlockedKeys {
                    keys: count("blocked_keys")?,
                    waiting: count("blocked_waiting")?,
                });
            }
            if let Some(next_due) = r.try_get::<Option<i64>, _>("next_due").store()? {
                held.push(HeldBack::BackingOff {
                    keys: count("backoff_keys")?,
                    waiting: count("backoff_waiting")?,
                    next_due: row::from_micros(next_due)?,
                });
            }
            if let Some(first) = r.try_get::<Option<i64>, _>("first_expired_at").store()? {
                held.push(HeldBack::ExpiredLeases {
                    leases: count("expired_leases")?,
                    events: count("expired_events")?,
                    first_expired_at: row::from_micros(first)?,
                });
            }
            if count("suspects")? > 0 {
                held.push(HeldBack::CrashSuspects {
                    events: count("suspects")?,
                });
            }
            Ok(held)
        })
        .await
    }

    async fn event_state(&self, event_id: EventId) -> Result<Option<EventState>, StoreError> {
        crate::error::during(
            "event_state",
            || self.config().tables.events(),
            async move {
                let row = sqlx::query(&self.queries.event_state)
                    .bind(event_id.to_string())
                    .fetch_optional(&self.pool)
                    .await
                    .store()?;
                row.as_ref().map(event_state).transpose()
            },
        )
        .await
    }

    async fn failed_events(&self, limit: usize) -> Result<Vec<FailedEvent>, StoreError> {
        crate::error::during(
            "failed_events",
            || self.config().tables.events(),
            async move {
                let rows = sqlx::query(&self.queries.failed_events)
                    .bind(limit.min(i64::MAX as usize) as i64)
                    .fetch_all(&self.pool)
                    .await
                    .store()?;
                let mut failed = Vec::with_capacity(rows.len());
                for r in &rows {
                    let event = row::raw_event(r)?.decode().unwrap_or_else(|u| u.event);
                    failed.push(FailedEvent {
                        history: self.history(event.event_id).await?,
                        blocks_key: r.try_get("blocks_key").store()?,
                        superseded_by: superseded_by(r)?,
                        event,
                    });
                }
                Ok(failed)
            },
        )
        .await
    }

    async fn history(&self, event_id: EventId) -> Result<Vec<AttemptRecord>, StoreError> {
        crate::error::during("history", || self.config().tables.events(), async move {
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
        })
        .await
    }

    async fn blocked_keys(&self) -> Result<Vec<BlockedKey>, StoreError> {
        crate::error::during(
            "blocked_keys",
            || self.config().tables.events(),
            async move {
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
            },
        )
        .await
    }

    async fn requeue(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        crate::error::during("requeue", || self.config().tables.events(), async move {
            let query = self.queries.requeue.clone();
            self.operator_update(&query, event_id, AttemptKind::Requeued, action)
                .await
        })
        .await
    }

    async fn skip(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        crate::error::during("skip", || self.config().tables.events(), async move {
            let query = self.queries.skip.clone();
            self.operator_update(&query, event_id, AttemptKind::Skipped, action)
                .await
        })
        .await
    }

    async fn supersede(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        crate::error::during("supersede", || self.config().tables.events(), async move {
            check_event(&replacement, &self.config.limits, false)?;
            self.sync_clock().await?;
            let mut tx = self.begin_immediate().await?;
            let now = self.now(&mut tx).await?;
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
                .bind(
                    self.config
                        .delay_ms(replacement.available_at)
                        .map(|ms| now.saturating_add(ms.saturating_mul(1000))),
                )
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
        })
        .await
    }

    async fn purge_published(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        crate::error::during(
            "purge_published",
            || self.config().tables.events(),
            async move {
                self.sync_clock().await?;
                let limit = batch_size.min(i64::MAX as usize) as i64;
                let mut tx = self.begin_immediate().await?;
                let cutoff = self
                    .now(&mut tx)
                    .await?
                    .saturating_sub(i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX));
                sqlx::query(&self.queries.purge_history)
                    .bind(cutoff)
                    .bind(limit)
                    .execute(&mut *tx)
                    .await
                    .store()?;
                let done = sqlx::query(&self.queries.purge)
                    .bind(cutoff)
                    .bind(limit)
                    .execute(&mut *tx)
                    .await
                    .store()?;
                tx.commit().await.store()?;
                Ok(done.rows_affected())
            },
        )
        .await
    }

    async fn relays(&self) -> Result<Vec<RelayStatus>, StoreError> {
        crate::error::during("relays", || self.config().tables.events(), async move {
            sqlx::query(&self.queries.relays)
                .fetch_all(&self.pool)
                .await
                .store()?
                .iter()
                .map(|r| {
                    Ok(RelayStatus {
                        relay: r.try_get("relay").store()?,
                        last_seen: row::time(r, "last_seen")?,
                        clock_skew: chrono::Duration::milliseconds(
                            r.try_get("clock_skew_ms").store()?,
                        ),
                        outage: RelayOutage::from_columns(
                            row::opt_time(r, "outage_since")?,
                            r.try_get("outage_destination").store()?,
                            r.try_get("outage_reason").store()?,
                        ),
                    })
                })
                .collect()
        })
        .await
    }
}
