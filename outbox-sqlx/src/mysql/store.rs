//! [`MySqlStore`]: the outbox on MySQL 8 / MariaDB ≥ 10.6.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::clock::add_duration;
use outbox_core::store::{
    AttemptKind, ClaimRequest, ClaimedBatch, ClaimedEvent, EnqueueOutcome, FencingToken, Lease,
    Nack, NackAction, OutboxStore, OutboxWriter, RelayId, Release, SettleReport,
};
use outbox_core::{EventId, NewEvent, Ordering, PoisonPolicy, StoreError};
use serde_json::{Value, json};
use sqlx::{MySql, MySqlConnection, MySqlPool, Row, Transaction};

use super::queries::{Queries, with_in_list};
use super::row::{self, micros};
use crate::codes;
use crate::config::StoreConfig;
use crate::error::ResultExt;
use crate::history::HistoryEntry;
use crate::validate::{check_event, headers_json};

const SCHEMA: &str = include_str!("schema.sql");

/// The outbox, attempt history, inbox and relay tables on MySQL 8 or
/// MariaDB ≥ 10.6.
///
/// Enqueue takes a row lock per partition key until commit, so writers of one
/// key take turns and a key's insert order is its commit order (DESIGN.md §5).
/// Claims take turns on a one-row lock table and lease rows found with
/// `FOR UPDATE SKIP LOCKED` (there is no `UPDATE … RETURNING`).
#[derive(Clone)]
pub struct MySqlStore {
    pub(super) pool: MySqlPool,
    pub(super) config: StoreConfig,
    pub(super) queries: Arc<Queries>,
}

impl std::fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlStore")
            .field("tables", &self.config.tables)
            .finish_non_exhaustive()
    }
}

type MyQuery<'q> = sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments>;

/// `query` (with an `{in}` list) over `values`, each bound in turn.
pub(super) fn query_in<'q, T>(query: &'q str, values: &'q [T]) -> MyQuery<'q>
where
    T: sqlx::Encode<'q, MySql> + sqlx::Type<MySql> + Send + Sync + 'q,
{
    values.iter().fold(sqlx::query(query), |q, v| q.bind(v))
}

impl MySqlStore {
    /// A store over `pool`.
    pub fn new(pool: MySqlPool, config: StoreConfig) -> Self {
        let queries = Arc::new(Queries::new(&config.tables));
        Self {
            pool,
            config,
            queries,
        }
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The schema DDL for these table names (what [`MySqlStore::migrate`] runs).
    pub fn schema_sql(&self) -> String {
        self.config.tables.render(SCHEMA)
    }

    /// Creates the tables if missing. Idempotent.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let schema = self.schema_sql();
        let mut conn = self.pool.acquire().await.store()?;
        for statement in split_statements(&schema) {
            sqlx::Executor::execute(&mut *conn, statement.as_str())
                .await
                .store()?;
        }
        Ok(())
    }

    /// Enqueues `events` on `conn`, typically `&mut *tx` of the business
    /// transaction. Locks the events' partition keys until that transaction
    /// ends (see the type's docs). Invalid events are refused before anything
    /// is sent.
    pub async fn enqueue(
        &self,
        conn: &mut MySqlConnection,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        for event in events {
            check_event(event, &self.config.limits, false)?;
        }
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // Sorted, so two transactions locking overlapping keys cannot deadlock.
        let keys: std::collections::BTreeSet<&str> =
            events.iter().map(|e| e.partition_key.as_str()).collect();
        let mut lock = self.queries.lock_keys.clone();
        lock.push_str(&vec!["(?)"; keys.len()].join(", "));
        lock.push_str(" ON DUPLICATE KEY UPDATE partition_key = partition_key");
        let mut query = sqlx::query(&lock);
        for key in &keys {
            query = query.bind(*key);
        }
        query.execute(&mut *conn).await.store()?;

        let ids: Vec<String> = events.iter().map(|e| e.event_id.to_string()).collect();
        let existing_ids = with_in_list(&self.queries.existing_ids, ids.len());
        let existing: HashSet<EventId> = query_in(&existing_ids, &ids)
            .fetch_all(&mut *conn)
            .await
            .store()?
            .iter()
            .map(|r| row::event_id(r, "event_id"))
            .collect::<Result<_, _>>()?;
        let mut seen = HashSet::new();
        let fresh: Vec<&NewEvent> = events
            .iter()
            .filter(|e| !existing.contains(&e.event_id) && seen.insert(e.event_id))
            .collect();
        if !fresh.is_empty() {
            let now = micros(self.config.clock.now());
            let mut insert = self.queries.enqueue_head.clone();
            insert.push_str(&vec![self.queries.enqueue_row; fresh.len()].join(", "));
            let mut query = sqlx::query(&insert);
            for e in &fresh {
                query = query
                    .bind(e.event_id.to_string())
                    .bind(&e.aggregate_type)
                    .bind(&e.aggregate_id)
                    .bind(&e.event_type)
                    .bind(&e.partition_key)
                    .bind(e.payload.as_str())
                    .bind(e.payload_version)
                    .bind(headers_json(e))
                    .bind(now)
                    .bind(e.available_at.map(micros).unwrap_or(now));
            }
            query.execute(&mut *conn).await.store()?;
        }
        let mut sequences: HashMap<EventId, i64> = HashMap::new();
        for r in query_in(&existing_ids, &ids)
            .fetch_all(&mut *conn)
            .await
            .store()?
        {
            sequences.insert(
                row::event_id(&r, "event_id")?,
                r.try_get("sequence").store()?,
            );
        }
        let mut reported = HashSet::new();
        Ok(events
            .iter()
            .map(|e| {
                if existing.contains(&e.event_id) || !reported.insert(e.event_id) {
                    EnqueueOutcome::AlreadyExists
                } else {
                    EnqueueOutcome::Inserted {
                        sequence: sequences[&e.event_id],
                    }
                }
            })
            .collect())
    }

    /// Appends history rows in one statement.
    pub(super) async fn record(
        &self,
        conn: &mut MySqlConnection,
        entries: &[HistoryEntry<'_>],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        sqlx::query(&self.queries.record_many)
            .bind(micros(self.config.clock.now()))
            .bind(HistoryEntry::batch_json(entries))
            .execute(conn)
            .await
            .store()?;
        Ok(())
    }

    /// Locks the rows of `leases` and returns those the lease still holds
    /// (token matches, in flight): `(sequence, event id, last owner, attempts)`.
    async fn lock_leased(
        &self,
        tx: &mut Transaction<'static, MySql>,
        leases: &[&Lease],
    ) -> Result<Vec<(i64, EventId, String, i64)>, StoreError> {
        let tokens: HashMap<i64, i64> = leases
            .iter()
            .map(|l| (l.sequence, l.fencing_token.0))
            .collect();
        let sequences: Vec<i64> = tokens.keys().copied().collect();
        let query = with_in_list(&self.queries.lock_leased, sequences.len());
        let rows = query_in(&query, &sequences)
            .fetch_all(&mut **tx)
            .await
            .store()?;
        let mut held = Vec::with_capacity(rows.len());
        for r in &rows {
            let sequence: i64 = r.try_get("sequence").store()?;
            let token: i64 = r.try_get("fencing_token").store()?;
            let status: i8 = r.try_get("status").store()?;
            if i16::from(status) == codes::IN_FLIGHT && tokens.get(&sequence) == Some(&token) {
                held.push((
                    sequence,
                    row::event_id(r, "event_id")?,
                    row::text(r, "lease_owner")?,
                    i64::from(r.try_get::<i32, _>("attempts").store()?),
                ));
            }
        }
        Ok(held)
    }
}

/// Splits the schema into statements (it has no procedural bodies).
fn split_statements(schema: &str) -> Vec<String> {
    let without_comments: String = schema
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    without_comments
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn report(asked: impl Iterator<Item = EventId>, settled: &HashSet<EventId>) -> SettleReport {
    SettleReport {
        applied: settled.len(),
        fenced: asked.filter(|id| !settled.contains(id)).collect(),
    }
}

#[async_trait]
impl OutboxWriter for MySqlStore {
    async fn enqueue(&self, events: &[NewEvent]) -> Result<Vec<EnqueueOutcome>, StoreError> {
        let mut tx = self.pool.begin().await.store()?;
        let outcomes = MySqlStore::enqueue(self, &mut tx, events).await?;
        tx.commit().await.store()?;
        Ok(outcomes)
    }
}

#[async_trait]
impl OutboxStore for MySqlStore {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        let now = micros(self.config.clock.now());
        let expires = micros(add_duration(
            self.config.clock.now(),
            request.lease_duration,
        ));
        let mut tx = self.pool.begin().await.store()?;
        // One claimer at a time: concurrent claims could split a key's prefix.
        sqlx::query(&self.queries.claim_lock)
            .execute(&mut *tx)
            .await
            .store()?;

        let looped: Vec<i64> = sqlx::query_scalar(&self.queries.crash_loop_candidates)
            .bind(i64::from(request.crash_loop_limit))
            .bind(now)
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .store()?;
        let looped = self.lock_claimable(&mut tx, &looped, now).await?;
        let mut crash_looped = Vec::new();
        if !looped.is_empty() {
            let fail = with_in_list(&self.queries.fail_rows, looped.len());
            let block = request.poison == PoisonPolicy::Block;
            looped
                .iter()
                .fold(sqlx::query(&fail).bind(block), |q, s| q.bind(s))
                .execute(&mut *tx)
                .await
                .store()?;
            crash_looped = self.read_rows(&mut tx, &looped).await?;
            let detail = format!(
                "{} publish attempts started and none finished",
                request.crash_loop_limit
            );
            let entries: Vec<_> = crash_looped
                .iter()
                .map(|c| {
                    let attempts = i64::from(c.event.attempts);
                    HistoryEntry {
                        event_id: c.event.event_id,
                        kind: AttemptKind::CrashLoop,
                        actor: request.owner.as_str(),
                        error_class: None,
                        detail: detail.as_str(),
                        attempts,
                    }
                })
                .collect();
            self.record(&mut tx, &entries).await?;
        }

        let (query, ordered) = match request.ordering {
            Ordering::PerKey => (&self.queries.claim_candidates_per_key, true),
            Ordering::Unordered => (&self.queries.claim_candidates_unordered, false),
        };
        let mut candidates = sqlx::query(query).bind(now).bind(now);
        if ordered {
            candidates = candidates.bind(now).bind(now);
        }
        let candidates: Vec<(i64, String)> = candidates
            .bind(request.limit.min(i64::MAX as usize) as i64)
            .fetch_all(&mut *tx)
            .await
            .store()?
            .iter()
            .map(|r| {
                Ok((
                    r.try_get("sequence").store()?,
                    row::text(r, "partition_key")?,
                ))
            })
            .collect::<Result<_, StoreError>>()?;
        let sequences: Vec<i64> = candidates.iter().map(|(s, _)| *s).collect();
        let locked: HashSet<i64> = self
            .lock_claimable(&mut tx, &sequences, now)
            .await?
            .into_iter()
            .collect();
        // A row skipped as locked (a settlement in progress) ends its key's
        // prefix: nothing after it may be leased in this batch.
        let mut stopped: HashSet<&str> = HashSet::new();
        let mut chosen = Vec::new();
        for (sequence, key) in &candidates {
            if ordered && stopped.contains(key.as_str()) {
                continue;
            }
            if locked.contains(sequence) {
                chosen.push(*sequence);
            } else {
                stopped.insert(key);
            }
        }
        let mut events = Vec::new();
        if !chosen.is_empty() {
            let lease = with_in_list(&self.queries.lease_rows, chosen.len());
            let owner = request.owner.as_str();
            chosen
                .iter()
                .fold(sqlx::query(&lease).bind(owner).bind(expires), |q, s| {
                    q.bind(s)
                })
                .execute(&mut *tx)
                .await
                .store()?;
            events = self.read_rows(&mut tx, &chosen).await?;
        }
        tx.commit().await.store()?;
        Ok(ClaimedBatch {
            events,
            crash_looped: crash_looped.into_iter().map(|c| c.event).collect(),
        })
    }

    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        if leases.is_empty() {
            return Ok(SettleReport::default());
        }
        let mut tx = self.pool.begin().await.store()?;
        let held = self
            .lock_leased(&mut tx, &leases.iter().collect::<Vec<_>>())
            .await?;
        let sequences: Vec<i64> = held.iter().map(|h| h.0).collect();
        if !sequences.is_empty() {
            let ack = with_in_list(&self.queries.ack, sequences.len());
            let now = micros(self.config.clock.now());
            sequences
                .iter()
                .fold(sqlx::query(&ack).bind(now), |q, s| q.bind(s))
                .execute(&mut *tx)
                .await
                .store()?;
            // A published replacement lifts the block of the event it superseded.
            let ids: Vec<String> = held.iter().map(|h| h.1.to_string()).collect();
            let unblock = with_in_list(&self.queries.unblock_superseded, ids.len());
            query_in(&unblock, &ids).execute(&mut *tx).await.store()?;
        }
        tx.commit().await.store()?;
        let settled = held.into_iter().map(|h| h.1).collect();
        Ok(report(leases.iter().map(|l| l.event_id), &settled))
    }

    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        if nacks.is_empty() {
            return Ok(SettleReport::default());
        }
        let now = self.config.clock.now();
        let mut tx = self.pool.begin().await.store()?;
        let held = self
            .lock_leased(&mut tx, &nacks.iter().map(|n| &n.lease).collect::<Vec<_>>())
            .await?;
        let by_id: HashMap<EventId, &Nack> = nacks.iter().map(|n| (n.lease.event_id, n)).collect();
        if !held.is_empty() {
            let batch: Vec<_> = held
                .iter()
                .map(|(sequence, id, _, _)| {
                    let (status, blocks, available) = match &by_id[id].action {
                        NackAction::Retry { after } => (
                            codes::PENDING,
                            false,
                            Some(micros(add_duration(now, *after))),
                        ),
                        NackAction::Fail { block_key, .. } => (codes::FAILED, *block_key, None),
                    };
                    json!({"s": sequence, "st": status, "b": blocks, "a": available})
                })
                .collect();
            let sequences: Vec<i64> = held.iter().map(|h| h.0).collect();
            let nack = with_in_list(&self.queries.nack, sequences.len());
            let batch = Value::Array(batch).to_string();
            sequences
                .iter()
                .fold(sqlx::query(&nack).bind(batch), |q, s| q.bind(s))
                .execute(&mut *tx)
                .await
                .store()?;
            let entries: Vec<_> = held
                .iter()
                .map(|(_, id, owner, attempts)| {
                    let nack = by_id[id];
                    HistoryEntry {
                        event_id: *id,
                        kind: codes::nack_kind(&nack.action),
                        actor: owner.as_str(),
                        error_class: Some(nack.error_class.as_str()),
                        detail: nack.error.as_str(),
                        attempts: attempts + 1,
                    }
                })
                .collect();
            self.record(&mut tx, &entries).await?;
        }
        tx.commit().await.store()?;
        let settled = held.into_iter().map(|h| h.1).collect();
        Ok(report(nacks.iter().map(|n| n.lease.event_id), &settled))
    }

    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        if releases.is_empty() {
            return Ok(SettleReport::default());
        }
        let mut tx = self.pool.begin().await.store()?;
        let held = self
            .lock_leased(
                &mut tx,
                &releases.iter().map(|r| &r.lease).collect::<Vec<_>>(),
            )
            .await?;
        let started: HashMap<i64, bool> = releases
            .iter()
            .map(|r| (r.lease.sequence, r.attempt_started))
            .collect();
        if !held.is_empty() {
            let batch: Vec<_> = held.iter().map(|h| json!([h.0, started[&h.0]])).collect();
            let sequences: Vec<i64> = held.iter().map(|h| h.0).collect();
            let release = with_in_list(&self.queries.release, sequences.len());
            let batch = Value::Array(batch).to_string();
            sequences
                .iter()
                .fold(sqlx::query(&release).bind(batch), |q, s| q.bind(s))
                .execute(&mut *tx)
                .await
                .store()?;
        }
        tx.commit().await.store()?;
        let settled = held.into_iter().map(|h| h.1).collect();
        Ok(report(releases.iter().map(|r| r.lease.event_id), &settled))
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

impl MySqlStore {
    /// Locks those of `sequences` that are still claimable, skipping rows a
    /// settlement holds. Returns the locked sequences.
    async fn lock_claimable(
        &self,
        tx: &mut Transaction<'static, MySql>,
        sequences: &[i64],
        now: i64,
    ) -> Result<Vec<i64>, StoreError> {
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        let lock = with_in_list(&self.queries.lock_rows, sequences.len());
        sequences
            .iter()
            .fold(sqlx::query_scalar(&lock).bind(now).bind(now), |q, s| {
                q.bind(s)
            })
            .fetch_all(&mut **tx)
            .await
            .store()
    }

    async fn read_rows(
        &self,
        tx: &mut Transaction<'static, MySql>,
        sequences: &[i64],
    ) -> Result<Vec<ClaimedEvent>, StoreError> {
        let read = with_in_list(&self.queries.read_rows, sequences.len());
        query_in(&read, sequences)
            .fetch_all(&mut **tx)
            .await
            .store()?
            .iter()
            .map(|r| {
                let token: i64 = r.try_get("fencing_token").store()?;
                let expires: Option<i64> = r.try_get("lease_expires_at").store()?;
                let event = row::stored_event(r)?;
                let lease = Lease {
                    sequence: event.sequence,
                    event_id: event.event_id,
                    fencing_token: FencingToken(token),
                    lease_expires_at: row::from_micros(expires.unwrap_or(0))?,
                };
                Ok(ClaimedEvent { event, lease })
            })
            .collect()
    }
}
