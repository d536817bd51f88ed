//! [`PgStore`]: the outbox on PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::clock::add_duration;
use outbox_core::store::{
    ClaimRequest, ClaimedBatch, ClaimedEvent, EnqueueOutcome, FencingToken, Lease, Nack,
    NackAction, OutboxStore, OutboxWriter, RelayId, Release, SettleReport,
};
use outbox_core::{EventId, NewEvent, Ordering, PoisonPolicy, StoreError};
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::queries::Queries;
use super::row;
use crate::codes;
use crate::config::StoreConfig;
use crate::error::ResultExt;
use crate::validate::{check_event, headers_json};

const SCHEMA: &str = include_str!("schema.sql");

/// The outbox, attempt history, inbox and relay tables on PostgreSQL (≥ 13).
///
/// Clones share the pool. Enqueue inside your own transaction with
/// [`PgStore::enqueue`]; run relays over the store with
/// [`outbox_core::Relay`], woken by [`PgStore::wake_up`].
#[derive(Clone)]
pub struct PgStore {
    pub(super) pool: PgPool,
    pub(super) config: StoreConfig,
    pub(super) queries: Arc<Queries>,
    /// The last claim found nothing: the next one asks first whether there
    /// is anything to claim (one statement instead of a transaction). A
    /// wake-up that already knows (it asked, or was notified) clears it.
    pub(super) idle: Arc<AtomicBool>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("tables", &self.config.tables)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// A store over `pool`. Table names were validated when built.
    pub fn new(pool: PgPool, config: StoreConfig) -> Self {
        let queries = Arc::new(Queries::new(&config.tables));
        Self {
            pool,
            config,
            queries,
            idle: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The exact claim statement for `ordering`, for `EXPLAIN` and review.
    /// Parameters: `$1` now, `$2` owner, `$3` lease expiry, `$4` limit,
    /// `$5` crash-loop limit. It runs after `SELECT pg_advisory_xact_lock(…),
    /// set_config('jit', 'off', true)` in the same transaction.
    pub fn claim_statement(&self, ordering: Ordering) -> &str {
        match ordering {
            Ordering::PerKey => &self.queries.claim_per_key,
            Ordering::Unordered => &self.queries.claim_unordered,
        }
    }

    /// The schema DDL for these table names (what [`PgStore::migrate`] runs;
    /// `migrations/postgres/` holds it rendered with the default names).
    pub fn schema_sql(&self) -> String {
        self.config.tables.render(SCHEMA)
    }

    /// Creates the tables, indexes and notify trigger if missing. Idempotent;
    /// concurrent callers take turns.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.store()?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(self.queries.lock_key ^ 0x5eed)
            .execute(&mut *tx)
            .await
            .store()?;
        let schema = self.schema_sql();
        sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&schema))
            .await
            .store()?;
        tx.commit().await.store()
    }

    /// Enqueues `events` on `conn`, typically `&mut *tx` of the business
    /// transaction, in one statement. Each outcome says whether a
    /// row was written or the `event_id` already existed (a no-op). Invalid
    /// events are refused before anything is sent.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        for event in events {
            check_event(event, &self.config.limits, true)?;
        }
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.config.clock.now();
        let rows = sqlx::query(&self.queries.enqueue)
            .bind(
                events
                    .iter()
                    .map(|e| *e.event_id.as_uuid())
                    .collect::<Vec<Uuid>>(),
            )
            .bind(
                events
                    .iter()
                    .map(|e| e.aggregate_type.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                events
                    .iter()
                    .map(|e| e.aggregate_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                events
                    .iter()
                    .map(|e| e.event_type.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                events
                    .iter()
                    .map(|e| e.partition_key.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                events
                    .iter()
                    .map(|e| e.payload.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                events
                    .iter()
                    .map(|e| e.payload_version as i32)
                    .collect::<Vec<_>>(),
            )
            .bind(events.iter().map(headers_json).collect::<Vec<_>>())
            .bind(
                events
                    .iter()
                    .map(|e| e.available_at)
                    .collect::<Vec<Option<DateTime<Utc>>>>(),
            )
            .bind(now)
            .fetch_all(conn)
            .await
            .store()?;
        let mut inserted = std::collections::HashMap::with_capacity(rows.len());
        for row in rows {
            let id: Uuid = row.try_get("event_id").store()?;
            let sequence: i64 = row.try_get("sequence").store()?;
            inserted.insert(id, sequence);
        }
        // A duplicate inside one batch: the first occurrence was written.
        Ok(events
            .iter()
            .map(|e| match inserted.remove(e.event_id.as_uuid()) {
                Some(sequence) => EnqueueOutcome::Inserted { sequence },
                None => EnqueueOutcome::AlreadyExists,
            })
            .collect())
    }

    /// Runs a settlement statement returning the `sequence` of each row it
    /// settled; the rest of `asked` (sequence, event id) was fenced.
    async fn settle_sequences(
        &self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
        asked: impl Iterator<Item = (i64, EventId)>,
    ) -> Result<SettleReport, StoreError> {
        // One statement, its own transaction; its estimate stays far below
        // `jit_above_cost` (the input arrays are estimated at ten rows).
        let rows = query.fetch_all(&self.pool).await.store()?;
        let mut settled = std::collections::HashSet::with_capacity(rows.len());
        for row in &rows {
            settled.insert(row.try_get::<i64, _>("sequence").store()?);
        }
        let fenced = asked
            .filter(|(sequence, _)| !settled.contains(sequence))
            .map(|(_, id)| id)
            .collect();
        Ok(SettleReport {
            applied: settled.len(),
            fenced,
        })
    }
}

#[async_trait]
impl OutboxWriter for PgStore {
    async fn enqueue(&self, events: &[NewEvent]) -> Result<Vec<EnqueueOutcome>, StoreError> {
        let mut tx = self.pool.begin().await.store()?;
        let outcomes = PgStore::enqueue(self, &mut tx, events).await?;
        tx.commit().await.store()?;
        Ok(outcomes)
    }
}

#[async_trait]
impl OutboxStore for PgStore {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        let now = self.config.clock.now();
        let expires = add_duration(now, request.lease_duration);
        // While idle, one cheap statement instead of a claim transaction.
        if self.idle.load(AtomicOrdering::Relaxed) {
            let anything: bool = sqlx::query_scalar(&self.queries.anything_to_do)
                .bind(now)
                .fetch_one(&self.pool)
                .await
                .store()?;
            if !anything {
                return Ok(ClaimedBatch::default());
            }
        }
        let limit = request.crash_loop_limit.min(i32::MAX as u32) as i32;
        let mut tx = self.pool.begin().await.store()?;
        // One claimer per table at a time (two concurrent claims could
        // otherwise split one key's prefix between two relays), JIT off for
        // the transaction, expired leases reaped; and whether any row may
        // have reached the crash-loop limit.
        let sweep: bool = sqlx::query_scalar(&self.queries.lock_and_reap)
            .bind(now)
            .bind(self.queries.lock_key)
            .fetch_one(&mut *tx)
            .await
            .store()?;
        let looped = if sweep {
            sqlx::query(&self.queries.crash_loops)
                .bind(now)
                .bind(limit)
                .bind(request.poison == PoisonPolicy::Block)
                .bind(request.owner.as_str())
                .fetch_all(&mut *tx)
                .await
                .store()?
        } else {
            Vec::new()
        };
        let claim = match request.ordering {
            Ordering::PerKey => &self.queries.claim_per_key,
            Ordering::Unordered => &self.queries.claim_unordered,
        };
        let rows = sqlx::query(claim)
            .bind(now)
            .bind(request.owner.as_str())
            .bind(expires)
            .bind(request.limit.min(i64::MAX as usize) as i64)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .store()?;
        tx.commit().await.store()?;
        self.idle.store(rows.is_empty(), AtomicOrdering::Relaxed);

        let mut events = Vec::with_capacity(rows.len());
        for r in &rows {
            let event = row::stored_event(r)?;
            let order: (i64, i64) = (r.try_get("order_xid").store()?, r.try_get("ord").store()?);
            let lease = Lease {
                sequence: event.sequence,
                event_id: event.event_id,
                fencing_token: FencingToken(r.try_get("fencing_token").store()?),
                lease_expires_at: r.try_get("lease_expires_at").store()?,
            };
            events.push((order, ClaimedEvent { event, lease }));
        }
        events.sort_by_key(|(order, _)| *order);
        Ok(ClaimedBatch {
            events: events.into_iter().map(|(_, e)| e).collect(),
            crash_looped: looped
                .iter()
                .map(row::stored_event)
                .collect::<Result<_, _>>()?,
        })
    }

    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        if leases.is_empty() {
            return Ok(SettleReport::default());
        }
        let query = sqlx::query(&self.queries.ack)
            .bind(leases.iter().map(|l| l.sequence).collect::<Vec<_>>())
            .bind(leases.iter().map(|l| l.fencing_token.0).collect::<Vec<_>>())
            .bind(self.config.clock.now());
        self.settle_sequences(query, leases.iter().map(|l| (l.sequence, l.event_id)))
            .await
    }

    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        if nacks.is_empty() {
            return Ok(SettleReport::default());
        }
        let now = self.config.clock.now();
        let mut status = Vec::with_capacity(nacks.len());
        let mut blocks = Vec::with_capacity(nacks.len());
        let mut available = Vec::with_capacity(nacks.len());
        for nack in nacks {
            match &nack.action {
                NackAction::Retry { after } => {
                    status.push(codes::TRACKED);
                    blocks.push(false);
                    available.push(Some(add_duration(now, *after)));
                }
                NackAction::Fail { block_key, .. } => {
                    status.push(codes::FAILED);
                    blocks.push(*block_key);
                    available.push(None);
                }
            }
        }
        let query = sqlx::query(&self.queries.nack)
            .bind(nacks.iter().map(|n| n.lease.sequence).collect::<Vec<_>>())
            .bind(
                nacks
                    .iter()
                    .map(|n| n.lease.fencing_token.0)
                    .collect::<Vec<_>>(),
            )
            .bind(status)
            .bind(blocks)
            .bind(available)
            .bind(
                nacks
                    .iter()
                    .map(|n| codes::attempt_kind_code(codes::nack_kind(&n.action)))
                    .collect::<Vec<_>>(),
            )
            .bind(
                nacks
                    .iter()
                    .map(|n| n.error_class.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(nacks.iter().map(|n| n.error.as_str()).collect::<Vec<_>>())
            .bind(now);
        self.settle_sequences(
            query,
            nacks.iter().map(|n| (n.lease.sequence, n.lease.event_id)),
        )
        .await
    }

    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        if releases.is_empty() {
            return Ok(SettleReport::default());
        }
        let query = sqlx::query(&self.queries.release)
            .bind(
                releases
                    .iter()
                    .map(|r| r.lease.sequence)
                    .collect::<Vec<_>>(),
            )
            .bind(
                releases
                    .iter()
                    .map(|r| r.lease.fencing_token.0)
                    .collect::<Vec<_>>(),
            )
            .bind(
                releases
                    .iter()
                    .map(|r| r.attempt_started)
                    .collect::<Vec<_>>(),
            );
        self.settle_sequences(
            query,
            releases
                .iter()
                .map(|r| (r.lease.sequence, r.lease.event_id)),
        )
        .await
    }

    async fn heartbeat(&self, relay: &RelayId) -> Result<(), StoreError> {
        sqlx::query(&self.queries.heartbeat)
            .bind(relay.as_str())
            .bind(self.config.clock.now())
            .execute(&self.pool)
            .await
            .store()?;
        Ok(())
    }
}
