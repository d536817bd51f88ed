//! [`OutboxAdmin`] on PostgreSQL: lag, what holds publication back,
//! failures, blocked keys, operator actions.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::clock::elapsed_between;
use outbox_core::store::{
    AttemptKind, AttemptRecord, BlockedKey, EnqueueOutcome, EventState, EventTypeStats,
    FailedEvent, HeldBack, OpenTransaction, OperatorAction, OutboxAdmin, RelayOutage, RelayStatus,
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
    /// Appends an operator action to the event's history.
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
            .bind(&action.operator)
            .bind(detail)
            .bind(attempts)
            .execute(conn)
            .await
            .store()?;
        Ok(())
    }

    /// Runs an operator update that returns `attempts` and the key, records
    /// it, and lets the key's parked rows go if nothing blocks it any more.
    /// `NotFound` or `WrongState` if it matched no row.
    async fn operator_update(
        &self,
        query: &str,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
    ) -> Result<(), StoreError> {
        self.sync_clock().await?;
        let mut tx = crate::pool::begin(&self.pool).await?;
        let Some(row) = sqlx::query(query)
            .bind(event_id.as_uuid())
            .fetch_optional(&mut *tx)
            .await
            .store()?
        else {
            drop(tx);
            return Err(crate::admin_common::explain_miss(self, event_id).await);
        };
        let attempts: i32 = row.try_get("attempts").store()?;
        let key: String = row.try_get("partition_key").store()?;
        self.record_action(&mut tx, event_id, kind, action, &action.reason, attempts)
            .await?;
        sqlx::query(&self.queries.unpark_key)
            .bind(&key)
            .execute(&mut *tx)
            .await
            .store()?;
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

fn count(row: &PgRow, column: &str) -> Result<u64, StoreError> {
    Ok(row.try_get::<Option<i64>, _>(column).store()?.unwrap_or(0) as u64)
}

#[async_trait]
impl OutboxAdmin for PgStore {
    async fn stats(&self) -> Result<Vec<EventTypeStats>, StoreError> {
        crate::error::during("stats", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let rows = sqlx::query(&self.queries.stats)
                .fetch_all(&self.pool)
                .await
                .store()?;
            rows.iter()
                .map(|r| {
                    let oldest: Option<DateTime<Utc>> = r.try_get("oldest").store()?;
                    let now: DateTime<Utc> = r.try_get("now").store()?;
                    Ok(EventTypeStats {
                        event_type: r.try_get("event_type").store()?,
                        claimable: count(r, "claimable")?,
                        oldest_claimable_age: oldest.map(|t| elapsed_between(now, t)),
                        parked: count(r, "parked")?,
                        in_flight: count(r, "in_flight")?,
                        failed: count(r, "failed")?,
                        blocked: count(r, "blocked")?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn held_back(&self) -> Result<Vec<HeldBack>, StoreError> {
        crate::error::during("held_back", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let r = sqlx::query(&self.queries.held_back)
                .fetch_one(&self.pool)
                .await
                .store()?;
            let mut held = Vec::new();
            if count(&r, "blocked_keys")? > 0 {
                held.push(HeldBack::BlockedKeys {
                    keys: count(&r, "blocked_keys")?,
                    waiting: count(&r, "blocked_waiting")?,
                });
            }
            if let Some(next_due) = r.try_get::<Option<DateTime<Utc>>, _>("next_due").store()? {
                held.push(HeldBack::BackingOff {
                    keys: count(&r, "backoff_keys")?,
                    waiting: count(&r, "backoff_waiting")?,
                    next_due,
                });
            }
            if let Some(first_expired_at) = r
                .try_get::<Option<DateTime<Utc>>, _>("first_expired_at")
                .store()?
            {
                held.push(HeldBack::ExpiredLeases {
                    leases: count(&r, "expired_leases")?,
                    events: count(&r, "expired_events")?,
                    first_expired_at,
                });
            }
            if let (Some(oldest_claimed_at), Some(first_expires_at)) = (
                r.try_get::<Option<DateTime<Utc>>, _>("long_claimed_at")
                    .store()?,
                r.try_get::<Option<DateTime<Utc>>, _>("long_expires_at")
                    .store()?,
            ) {
                held.push(HeldBack::LongLeases {
                    owners: r
                        .try_get::<Option<Vec<String>>, _>("long_owners")
                        .store()?
                        .unwrap_or_default(),
                    events: count(&r, "long_events")?,
                    oldest_claimed_at,
                    first_expires_at,
                });
            }
            if count(&r, "suspects")? > 0 {
                held.push(HeldBack::CrashSuspects {
                    events: count(&r, "suspects")?,
                });
            }
            // Seeing other sessions needs pg_read_all_stats (or the same role);
            // without it the list is what the server shows.
            let transactions = sqlx::query(&self.queries.open_transactions)
                .fetch_all(&self.pool)
                .await
                .store()?
                .iter()
                .map(|t| {
                    Ok(OpenTransaction {
                        pid: t.try_get("pid").store()?,
                        database: t.try_get("database").store()?,
                        started_at: t.try_get("xact_start").store()?,
                        state: t.try_get("state").store()?,
                        query_started_at: t.try_get("query_start").store()?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            if !transactions.is_empty() {
                held.push(HeldBack::OpenTransactions { transactions });
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
                    .bind(event_id.as_uuid())
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
                        // A row that does not decode is listed as far as it reads;
                        // its history says why it failed.
                        let event = row::raw_event(r)?.decode().unwrap_or_else(|u| u.event);
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
                .bind(event_id.as_uuid())
                .fetch_all(&self.pool)
                .await
                .store()?
                .iter()
                .map(|r| row::attempt_record(r).map(|(_, record)| record))
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
                            blocking_event_id: EventId::from_uuid(r.try_get("event_id").store()?),
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
            check_event(&replacement, &self.config.limits, true)?;
            self.sync_clock().await?;
            let mut tx = crate::pool::begin(&self.pool).await?;
            let Some(old) = sqlx::query(&self.queries.supersede_lock)
                .bind(event_id.as_uuid())
                .fetch_optional(&mut *tx)
                .await
                .store()?
            else {
                drop(tx);
                return Err(crate::admin_common::explain_miss(self, event_id).await);
            };
            let position: Option<i64> = old.try_get("position").store()?;
            let attempts: i32 = old.try_get("attempts").store()?;
            let key: String = old.try_get("partition_key").store()?;
            let inserted = sqlx::query(&self.queries.supersede_insert)
                .bind(position)
                .bind(replacement.event_id.as_uuid())
                .bind(&replacement.aggregate_type)
                .bind(&replacement.aggregate_id)
                .bind(&replacement.event_type)
                .bind(&replacement.partition_key)
                .bind(replacement.payload.as_str())
                .bind(replacement.payload_version as i32)
                .bind(headers_json(&replacement))
                .bind(self.config.delay_ms(replacement.available_at))
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
            sqlx::query(&self.queries.unpark_key)
                .bind(&key)
                .execute(&mut *tx)
                .await
                .store()?;
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
                let older_than_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
                let purged: i64 = sqlx::query_scalar(&self.queries.purge)
                    .bind(older_than_ms)
                    .bind(batch_size.min(i64::MAX as usize) as i64)
                    .fetch_one(&self.pool)
                    .await
                    .store()?;
                if (purged as u64) < batch_size as u64 {
                    // Nothing the cutoff allows is left: older cursor-log entries
                    // describe no row any more.
                    sqlx::query(&self.queries.prune_cursor_log)
                        .execute(&self.pool)
                        .await
                        .store()?;
                }
                Ok(purged as u64)
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
                        last_seen: r.try_get("last_seen").store()?,
                        clock_skew: chrono::Duration::milliseconds(
                            r.try_get("clock_skew_ms").store()?,
                        ),
                        outage: RelayOutage::from_columns(
                            r.try_get("outage_since").store()?,
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
