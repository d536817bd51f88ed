//! [`OutboxAdmin`] for the diesel-async [`PgStore`]: the operator's view
//! and repairs, on `outbox-sql`'s statements.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_core::clock::elapsed_between;
use outbox_core::store::{
    AttemptKind, AttemptRecord, BlockedKey, EnqueueOutcome, EventState, EventTypeStats,
    FailedEvent, HeldBack, OpenTransaction, OperatorAction, OutboxAdmin, RelayOutage, RelayStatus,
};
use outbox_core::{EventId, NewEvent, StoreError};
use outbox_sql::codes;
use outbox_sql::validate::{check_event, headers_json};

use super::rows::{
    BlockedKeyRow, CountRow, EventStateRow, FailedRow, HeldBackRow, HistoryRow, OpenTransactionRow,
    OperatorRow, PositionRow, RelayRow, SequenceRow, StatsRow,
};
use super::store::PgStore;
use crate::error::ResultExt;

impl PgStore {
    /// Appends an operator action to the event's history.
    async fn record_action(
        &self,
        conn: &mut AsyncPgConnection,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
        detail: &str,
        attempts: i32,
    ) -> Result<(), crate::Error> {
        diesel::sql_query(self.queries().record.as_str())
            .bind::<SqlUuid, _>(*event_id.as_uuid())
            .bind::<Text, _>(codes::attempt_kind_code(kind))
            .bind::<Text, _>(action.operator.as_str())
            .bind::<Text, _>(detail)
            .bind::<Integer, _>(attempts)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Lets the key's parked rows go if nothing blocks it any more.
    async fn unpark(&self, conn: &mut AsyncPgConnection, key: &str) -> Result<(), crate::Error> {
        diesel::sql_query(self.queries().unpark_key.as_str())
            .bind::<Text, _>(key)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Runs an operator update that returns `attempts` and the key, records
    /// it and unparks the key; `NotFound` or `WrongState` if it matched no
    /// row.
    async fn operator_update(
        &self,
        query: &str,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        self.sync_clock(&mut conn).await?;
        let updated = conn
            .transaction::<_, crate::Error, _>(async |conn| {
                let rows: Vec<OperatorRow> = diesel::sql_query(query)
                    .bind::<SqlUuid, _>(*event_id.as_uuid())
                    .load(&mut *conn)
                    .await?;
                let Some(row) = rows.into_iter().next() else {
                    return Ok(false);
                };
                self.record_action(conn, event_id, kind, action, &action.reason, row.attempts)
                    .await?;
                self.unpark(conn, &row.partition_key).await?;
                Ok(true)
            })
            .await
            .map_err(crate::Error::into_store_error)?;
        if updated {
            Ok(())
        } else {
            Err(outbox_sql::admin_common::explain_miss(self, event_id).await)
        }
    }
}

fn event_state(row: EventStateRow) -> EventState {
    match row.status {
        codes::PENDING => EventState::Pending {
            available_at: row.available_at,
            attempts: row.attempts as u32,
        },
        codes::IN_FLIGHT => EventState::InFlight {
            owner: row.lease_owner.unwrap_or_default(),
            lease_expires_at: row.lease_expires_at.unwrap_or(row.available_at),
        },
        codes::PUBLISHED => EventState::Published {
            published_at: row.published_at.unwrap_or(row.available_at),
        },
        _ => EventState::Failed {
            blocks_key: row.blocks_key,
            superseded_by: row.superseded_by.map(EventId::from_uuid),
        },
    }
}

#[async_trait]
impl OutboxAdmin for PgStore {
    async fn stats(&self) -> Result<Vec<EventTypeStats>, StoreError> {
        let stats = async {
            let mut conn = self.conn().await?;
            self.sync_clock(&mut conn).await?;
            let rows: Vec<StatsRow> = diesel::sql_query(self.queries().stats.as_str())
                .load(&mut conn)
                .await
                .store()?;
            Ok(rows
                .into_iter()
                .map(|r| EventTypeStats {
                    event_type: r.event_type,
                    claimable: r.claimable as u64,
                    oldest_claimable_age: r.oldest.map(|t| elapsed_between(r.now, t)),
                    parked: r.parked as u64,
                    in_flight: r.in_flight as u64,
                    failed: r.failed as u64,
                    blocked: r.blocked as u64,
                })
                .collect())
        };
        stats
            .await
            .map_err(|e: StoreError| e.during("stats", self.table()))
    }

    async fn held_back(&self) -> Result<Vec<HeldBack>, StoreError> {
        let held = async {
            let mut conn = self.conn().await?;
            self.sync_clock(&mut conn).await?;
            let r: HeldBackRow = diesel::sql_query(self.queries().held_back.as_str())
                .get_result(&mut conn)
                .await
                .store()?;
            let mut held = Vec::new();
            if r.blocked_keys > 0 {
                held.push(HeldBack::BlockedKeys {
                    keys: r.blocked_keys as u64,
                    waiting: r.blocked_waiting as u64,
                });
            }
            if let Some(next_due) = r.next_due {
                held.push(HeldBack::BackingOff {
                    keys: r.backoff_keys as u64,
                    waiting: r.backoff_waiting as u64,
                    next_due,
                });
            }
            if let Some(first_expired_at) = r.first_expired_at {
                held.push(HeldBack::ExpiredLeases {
                    leases: r.expired_leases as u64,
                    events: r.expired_events as u64,
                    first_expired_at,
                });
            }
            if let (Some(oldest_claimed_at), Some(first_expires_at)) =
                (r.long_claimed_at, r.long_expires_at)
            {
                held.push(HeldBack::LongLeases {
                    owners: r.long_owners.unwrap_or_default(),
                    events: r.long_events as u64,
                    oldest_claimed_at,
                    first_expires_at,
                });
            }
            if r.suspects > 0 {
                held.push(HeldBack::CrashSuspects {
                    events: r.suspects as u64,
                });
            }
            let transactions: Vec<OpenTransactionRow> =
                diesel::sql_query(self.queries().open_transactions.as_str())
                    .load(&mut conn)
                    .await
                    .store()?;
            if !transactions.is_empty() {
                held.push(HeldBack::OpenTransactions {
                    transactions: transactions
                        .into_iter()
                        .map(|t| OpenTransaction {
                            pid: t.pid,
                            database: t.database,
                            started_at: t.xact_start,
                            state: t.state,
                            query_started_at: t.query_start,
                        })
                        .collect(),
                });
            }
            Ok(held)
        };
        held.await
            .map_err(|e: StoreError| e.during("held_back", self.table()))
    }

    async fn event_state(&self, event_id: EventId) -> Result<Option<EventState>, StoreError> {
        let state = async {
            let mut conn = self.conn().await?;
            let rows: Vec<EventStateRow> = diesel::sql_query(self.queries().event_state.as_str())
                .bind::<SqlUuid, _>(*event_id.as_uuid())
                .load(&mut conn)
                .await
                .store()?;
            Ok(rows.into_iter().next().map(event_state))
        };
        state
            .await
            .map_err(|e: StoreError| e.during("event_state", self.table()))
    }

    async fn failed_events(&self, limit: usize) -> Result<Vec<FailedEvent>, StoreError> {
        let failed = async {
            let mut conn = self.conn().await?;
            let rows: Vec<FailedRow> = diesel::sql_query(self.queries().failed_events.as_str())
                .bind::<BigInt, _>(limit.min(i64::MAX as usize) as i64)
                .load(&mut conn)
                .await
                .store()?;
            let ids: Vec<uuid::Uuid> = rows.iter().map(|r| r.event.event_id()).collect();
            let mut histories: HashMap<EventId, Vec<AttemptRecord>> = HashMap::new();
            let history: Vec<HistoryRow> = diesel::sql_query(self.queries().history_many.as_str())
                .bind::<Array<SqlUuid>, _>(ids)
                .load(&mut conn)
                .await
                .store()?;
            for row in history {
                let id = EventId::from_uuid(row.event_id);
                histories.entry(id).or_default().push(row.record()?);
            }
            Ok(rows
                .into_iter()
                .map(|r| {
                    // A row that does not decode is listed as far as it
                    // reads; its history says why it failed.
                    let event = r.event.raw().decode().unwrap_or_else(|u| u.event);
                    FailedEvent {
                        history: histories.remove(&event.event_id).unwrap_or_default(),
                        blocks_key: r.blocks_key,
                        superseded_by: r.superseded_by.map(EventId::from_uuid),
                        event,
                    }
                })
                .collect())
        };
        failed
            .await
            .map_err(|e: StoreError| e.during("failed_events", self.table()))
    }

    async fn history(&self, event_id: EventId) -> Result<Vec<AttemptRecord>, StoreError> {
        if self.event_state(event_id).await?.is_none() {
            return Err(StoreError::NotFound(event_id));
        }
        let history = async {
            let mut conn = self.conn().await?;
            let rows: Vec<HistoryRow> = diesel::sql_query(self.queries().history.as_str())
                .bind::<SqlUuid, _>(*event_id.as_uuid())
                .load(&mut conn)
                .await
                .store()?;
            rows.into_iter()
                .map(HistoryRow::record)
                .collect::<Result<Vec<_>, StoreError>>()
        };
        history
            .await
            .map_err(|e: StoreError| e.during("history", self.table()))
    }

    async fn blocked_keys(&self) -> Result<Vec<BlockedKey>, StoreError> {
        let keys = async {
            let mut conn = self.conn().await?;
            let rows: Vec<BlockedKeyRow> = diesel::sql_query(self.queries().blocked_keys.as_str())
                .load(&mut conn)
                .await
                .store()?;
            Ok(rows
                .into_iter()
                .map(|r| BlockedKey {
                    partition_key: r.partition_key,
                    blocking_event_id: EventId::from_uuid(r.event_id),
                    backlog: r.backlog as u64,
                })
                .collect())
        };
        keys.await
            .map_err(|e: StoreError| e.during("blocked_keys", self.table()))
    }

    async fn requeue(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        let query = self.queries().requeue.clone();
        self.operator_update(&query, event_id, AttemptKind::Requeued, action)
            .await
            .map_err(|e| e.during("requeue", self.table()))
    }

    async fn skip(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        let query = self.queries().skip.clone();
        self.operator_update(&query, event_id, AttemptKind::Skipped, action)
            .await
            .map_err(|e| e.during("skip", self.table()))
    }

    async fn supersede(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        check_event(&replacement, &self.config().limits, true)?;
        let mut conn = self.conn().await?;
        self.sync_clock(&mut conn).await?;
        let replacement = &replacement;
        let done = conn
            .transaction::<_, crate::Error, _>(async |conn| {
                let old: Vec<PositionRow> =
                    diesel::sql_query(self.queries().supersede_lock.as_str())
                        .bind::<SqlUuid, _>(*event_id.as_uuid())
                        .load(&mut *conn)
                        .await?;
                let Some(old) = old.into_iter().next() else {
                    return Ok(None);
                };
                let inserted: Vec<SequenceRow> =
                    diesel::sql_query(self.queries().supersede_insert.as_str())
                        .bind::<Nullable<BigInt>, _>(old.position)
                        .bind::<SqlUuid, _>(*replacement.event_id.as_uuid())
                        .bind::<Text, _>(replacement.aggregate_type.as_str())
                        .bind::<Text, _>(replacement.aggregate_id.as_str())
                        .bind::<Text, _>(replacement.event_type.as_str())
                        .bind::<Text, _>(replacement.partition_key.as_str())
                        .bind::<Text, _>(replacement.payload.as_str())
                        .bind::<Integer, _>(replacement.payload_version as i32)
                        .bind::<Text, _>(headers_json(replacement))
                        .bind::<Nullable<BigInt>, _>(
                            self.config().delay_ms(replacement.available_at),
                        )
                        .load(&mut *conn)
                        .await?;
                let Some(inserted) = inserted.into_iter().next() else {
                    return Ok(Some(EnqueueOutcome::AlreadyExists));
                };
                diesel::sql_query(self.queries().supersede_mark.as_str())
                    .bind::<SqlUuid, _>(*event_id.as_uuid())
                    .bind::<SqlUuid, _>(*replacement.event_id.as_uuid())
                    .execute(&mut *conn)
                    .await?;
                let detail = format!("superseded by {}: {}", replacement.event_id, action.reason);
                self.record_action(
                    conn,
                    event_id,
                    AttemptKind::Superseded,
                    action,
                    &detail,
                    old.row.attempts,
                )
                .await?;
                self.unpark(conn, &old.row.partition_key).await?;
                Ok(Some(EnqueueOutcome::Inserted {
                    sequence: inserted.sequence,
                }))
            })
            .await
            .map_err(|e| e.into_store_error().during("supersede", self.table()))?;
        match done {
            Some(outcome) => Ok(outcome),
            None => Err(outbox_sql::admin_common::explain_miss(self, event_id).await),
        }
    }

    async fn purge_published(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        let purge = async {
            let mut conn = self.conn().await?;
            self.sync_clock(&mut conn).await?;
            let older_than_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
            let purged: CountRow = diesel::sql_query(self.queries().purge.as_str())
                .bind::<BigInt, _>(older_than_ms)
                .bind::<BigInt, _>(batch_size.min(i64::MAX as usize) as i64)
                .get_result(&mut conn)
                .await
                .store()?;
            if (purged.count as u64) < batch_size as u64 {
                // Nothing the cutoff allows is left: older cursor-log
                // entries describe no row any more.
                diesel::sql_query(self.queries().prune_cursor_log.as_str())
                    .execute(&mut conn)
                    .await
                    .store()?;
            }
            Ok(purged.count as u64)
        };
        purge
            .await
            .map_err(|e: StoreError| e.during("purge_published", self.table()))
    }

    async fn relays(&self) -> Result<Vec<RelayStatus>, StoreError> {
        let relays = async {
            let mut conn = self.conn().await?;
            let rows: Vec<RelayRow> = diesel::sql_query(self.queries().relays.as_str())
                .load(&mut conn)
                .await
                .store()?;
            Ok(rows
                .into_iter()
                .map(|r| RelayStatus {
                    relay: r.relay,
                    last_seen: r.last_seen,
                    clock_skew: chrono::Duration::milliseconds(r.clock_skew_ms),
                    outage: RelayOutage::from_columns(
                        r.outage_since,
                        r.outage_destination,
                        r.outage_reason,
                    ),
                })
                .collect())
        };
        relays
            .await
            .map_err(|e: StoreError| e.during("relays", self.table()))
    }
}
