//! [`SqliteStore`]: the outbox on SQLite.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::clock::add_duration;
use outbox_core::store::{
    AttemptKind, ClaimRequest, ClaimedBatch, ClaimedEvent, EnqueueOutcome, FencingToken, Lease,
    Nack, NackAction, OutboxStore, OutboxWriter, RelayId, Release, SettleReport,
};
use outbox_core::{EventId, NewEvent, Ordering, PoisonPolicy, StoreError};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool, Transaction};

use super::queries::Queries;
use super::row::{self, micros};
use crate::codes;
use crate::config::StoreConfig;
use crate::error::ResultExt;
use crate::history::HistoryEntry;
use crate::validate::{check_event, headers_json};

const SCHEMA: &str = include_str!("schema.sql");

/// The outbox, attempt history, inbox and relay tables in a SQLite file.
///
/// SQLite has one writer at a time: claims run in `BEGIN IMMEDIATE`
/// transactions, so leases and fencing hold across every process sharing the
/// file (open it in WAL mode with a busy timeout, as [`SqliteStore::open`]
/// does), and insert order is commit order.
#[derive(Clone)]
pub struct SqliteStore {
    pub(super) pool: SqlitePool,
    pub(super) config: StoreConfig,
    pub(super) queries: Arc<Queries>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("tables", &self.config.tables)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// A store over `pool`. Refuses a schema in the table names (SQLite has
    /// none; use a prefix).
    pub fn new(pool: SqlitePool, config: StoreConfig) -> Result<Self, StoreError> {
        if config.tables.schema().is_some() {
            return Err(StoreError::Config(
                "SQLite tables take a prefix, not a schema".into(),
            ));
        }
        let queries = Arc::new(Queries::new(&config.tables));
        Ok(Self {
            pool,
            config,
            queries,
        })
    }

    /// Opens (creating if missing) the database file at `path` in WAL mode
    /// with a 5 s busy timeout and [`crate::guard_cancelled_transactions`],
    /// and returns a store on it with `config`.
    pub async fn open(path: &str, config: StoreConfig) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))
            .store()?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        // On release too, not only on acquire: a connection left inside a
        // transaction holds SQLite's single write lock until it is closed.
        // The ping lets a queued, cancelled BEGIN finish before the check.
        let options_with_release_check = SqlitePoolOptions::new().after_release(|conn, _meta| {
            Box::pin(async move {
                sqlx::Connection::ping(conn).await?;
                Ok(!sqlx::Connection::is_in_transaction(conn))
            })
        });
        let pool = crate::guard_cancelled_transactions(options_with_release_check)
            .max_connections(8)
            .connect_with(options)
            .await
            .store()?;
        Self::new(pool, config)
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The schema DDL for these table names (what [`SqliteStore::migrate`] runs).
    pub fn schema_sql(&self) -> String {
        self.config.tables.render(SCHEMA)
    }

    /// Creates the tables and indexes if missing. Idempotent.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let schema = self.schema_sql();
        let mut tx = self.begin_immediate().await?;
        sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&schema))
            .await
            .store()?;
        tx.commit().await.store()
    }

    /// A write transaction that takes SQLite's write lock up front, so a
    /// read-then-write never fails on a stale snapshot.
    pub async fn begin_immediate(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.store()
    }

    /// Enqueues `events` on `conn`, typically `&mut *tx` of the business
    /// transaction, in one statement. Invalid events are refused before
    /// anything is sent.
    pub async fn enqueue(
        &self,
        conn: &mut SqliteConnection,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        for event in events {
            check_event(event, &self.config.limits, false)?;
        }
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let batch: Vec<_> = events
            .iter()
            .map(|e| {
                json!({
                    "id": e.event_id.to_string(),
                    "at": e.aggregate_type,
                    "ai": e.aggregate_id,
                    "et": e.event_type,
                    "pk": e.partition_key,
                    "p": e.payload.as_str(),
                    "v": e.payload_version,
                    "h": headers_json(e),
                    "a": e.available_at.map(micros),
                })
            })
            .collect();
        let rows = sqlx::query(&self.queries.enqueue)
            .bind(serde_json::Value::Array(batch).to_string())
            .bind(micros(self.config.clock.now()))
            .fetch_all(conn)
            .await
            .store()?;
        let mut inserted = HashMap::with_capacity(rows.len());
        for r in &rows {
            inserted.insert(
                row::event_id(r, "event_id")?,
                r.try_get::<i64, _>("sequence").store()?,
            );
        }
        Ok(events
            .iter()
            .map(|e| match inserted.remove(&e.event_id) {
                Some(sequence) => EnqueueOutcome::Inserted { sequence },
                None => EnqueueOutcome::AlreadyExists,
            })
            .collect())
    }

    /// Appends history rows: `(event, kind, actor, class, detail, attempts)`.
    /// Appends history rows in one statement.
    pub(super) async fn record(
        &self,
        conn: &mut SqliteConnection,
        entries: &[HistoryEntry<'_>],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        sqlx::query(&self.queries.record_many)
            .bind(HistoryEntry::batch_json(entries))
            .bind(micros(self.config.clock.now()))
            .execute(conn)
            .await
            .store()?;
        Ok(())
    }

    async fn settle_json(
        &self,
        query: &str,
        batch: serde_json::Value,
        now: Option<i64>,
        asked: impl Iterator<Item = EventId>,
    ) -> Result<SettleReport, StoreError> {
        let mut q = sqlx::query(query).bind(batch.to_string());
        if let Some(now) = now {
            q = q.bind(now);
        }
        let mut tx = self.begin_immediate().await?;
        let rows = q.fetch_all(&mut *tx).await.store()?;
        tx.commit().await.store()?;
        let settled: HashSet<EventId> = rows
            .iter()
            .map(|r| row::event_id(r, "event_id"))
            .collect::<Result<_, _>>()?;
        Ok(SettleReport {
            applied: settled.len(),
            fenced: asked.filter(|id| !settled.contains(id)).collect(),
        })
    }
}

#[async_trait]
impl OutboxWriter for SqliteStore {
    async fn enqueue(&self, events: &[NewEvent]) -> Result<Vec<EnqueueOutcome>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let outcomes = SqliteStore::enqueue(self, &mut tx, events).await?;
        tx.commit().await.store()?;
        Ok(outcomes)
    }
}

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        let now = self.config.clock.now();
        let expires = add_duration(now, request.lease_duration);
        let mut tx = self.begin_immediate().await?;
        let looped = sqlx::query(&self.queries.crash_loops)
            .bind(micros(now))
            .bind(i64::from(request.crash_loop_limit))
            .bind(request.poison == PoisonPolicy::Block)
            .fetch_all(&mut *tx)
            .await
            .store()?;
        let crash_looped: Vec<_> = looped
            .iter()
            .map(row::stored_event)
            .collect::<Result<_, _>>()?;
        let detail = format!(
            "{} publish attempts started and none finished",
            request.crash_loop_limit
        );
        let entries: Vec<_> = crash_looped
            .iter()
            .map(|e| {
                let attempts = i64::from(e.attempts);
                HistoryEntry {
                    event_id: e.event_id,
                    kind: AttemptKind::CrashLoop,
                    actor: request.owner.as_str(),
                    error_class: None,
                    detail: detail.as_str(),
                    attempts,
                }
            })
            .collect();
        self.record(&mut tx, &entries).await?;
        let claim = match request.ordering {
            Ordering::PerKey => &self.queries.claim_per_key,
            Ordering::Unordered => &self.queries.claim_unordered,
        };
        let rows = sqlx::query(claim)
            .bind(micros(now))
            .bind(request.owner.as_str())
            .bind(micros(expires))
            .bind(request.limit.min(i64::MAX as usize) as i64)
            .fetch_all(&mut *tx)
            .await
            .store()?;
        tx.commit().await.store()?;
        let mut events = Vec::with_capacity(rows.len());
        for r in &rows {
            let event = row::stored_event(r)?;
            let order: (i64, i64) = (r.try_get("ord_key").store()?, event.sequence);
            let lease = Lease {
                sequence: event.sequence,
                event_id: event.event_id,
                fencing_token: FencingToken(r.try_get("fencing_token").store()?),
                lease_expires_at: row::time(r, "lease_expires_at")?,
            };
            events.push((order, ClaimedEvent { event, lease }));
        }
        events.sort_by_key(|(order, _)| *order);
        Ok(ClaimedBatch {
            events: events.into_iter().map(|(_, e)| e).collect(),
            crash_looped,
        })
    }

    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        if leases.is_empty() {
            return Ok(SettleReport::default());
        }
        let batch = leases
            .iter()
            .map(|l| json!([l.sequence, l.fencing_token.0]))
            .collect();
        let now = micros(self.config.clock.now());
        self.settle_json(
            &self.queries.ack,
            batch,
            Some(now),
            leases.iter().map(|l| l.event_id),
        )
        .await
    }

    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        if nacks.is_empty() {
            return Ok(SettleReport::default());
        }
        let now = self.config.clock.now();
        let batch: Vec<_> = nacks
            .iter()
            .map(|n| {
                let (status, blocks, available) = match &n.action {
                    NackAction::Retry { after } => (
                        codes::PENDING,
                        false,
                        Some(micros(add_duration(now, *after))),
                    ),
                    NackAction::Fail { block_key, .. } => (codes::FAILED, *block_key, None),
                };
                json!({"s": n.lease.sequence, "t": n.lease.fencing_token.0, "st": status,
                       "b": blocks, "a": available})
            })
            .collect();
        let mut tx = self.begin_immediate().await?;
        let rows = sqlx::query(&self.queries.nack)
            .bind(serde_json::Value::Array(batch).to_string())
            .fetch_all(&mut *tx)
            .await
            .store()?;
        let by_id: HashMap<EventId, &Nack> = nacks.iter().map(|n| (n.lease.event_id, n)).collect();
        let mut settled = HashSet::new();
        let mut entries = Vec::with_capacity(rows.len());
        let mut owners = Vec::with_capacity(rows.len());
        for r in &rows {
            let id = row::event_id(r, "event_id")?;
            settled.insert(id);
            owners.push((
                id,
                r.try_get::<String, _>("lease_owner").store()?,
                r.try_get::<i64, _>("attempts").store()?,
            ));
        }
        for (id, owner, attempts) in &owners {
            let nack = by_id[id];
            entries.push(HistoryEntry {
                event_id: *id,
                kind: codes::nack_kind(&nack.action),
                actor: owner.as_str(),
                error_class: Some(nack.error_class.as_str()),
                detail: nack.error.as_str(),
                attempts: *attempts,
            });
        }
        self.record(&mut tx, &entries).await?;
        tx.commit().await.store()?;
        Ok(SettleReport {
            applied: settled.len(),
            fenced: nacks
                .iter()
                .map(|n| n.lease.event_id)
                .filter(|id| !settled.contains(id))
                .collect(),
        })
    }

    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        if releases.is_empty() {
            return Ok(SettleReport::default());
        }
        let batch = releases
            .iter()
            .map(|r| json!([r.lease.sequence, r.lease.fencing_token.0, r.attempt_started]))
            .collect();
        self.settle_json(
            &self.queries.release,
            batch,
            None,
            releases.iter().map(|r| r.lease.event_id),
        )
        .await
    }

    async fn heartbeat(&self, relay: &RelayId) -> Result<(), StoreError> {
        sqlx::query(&self.queries.heartbeat)
            .bind(relay.as_str())
            .bind(micros(self.config.clock.now()))
            .execute(&self.pool)
            .await
            .store()?;
        Ok(())
    }
}
