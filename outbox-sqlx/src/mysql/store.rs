//! [`MySqlStore`]: the outbox on MySQL 8 / MariaDB ≥ 10.6.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::store::{
    AttemptKind, ClaimRequest, ClaimedBatch, ClaimedEvent, EnqueueOutcome, FencingToken, Lease,
    Nack, NackAction, OutboxStore, OutboxWriter, RelayId, Release, SettleReport,
};
use outbox_core::{EventId, NewEvent, Ordering, PoisonPolicy, StoreError, UnreadableEvent};
use serde_json::{Value, json};
use sqlx::{MySql, MySqlConnection, MySqlPool, Row, Transaction};

use super::queries::{Queries, with_in_list};
use super::row;
use crate::blame::{InFlight, blame, new_lease_id, reap};
use crate::codes;
use crate::config::{Migrated, StoreConfig};
use crate::error::ResultExt;
use crate::history::HistoryEntry;
use crate::validate::{check_event, headers_json};

/// The version of the schema the store creates; tables of another version
/// are refused by `migrate` (see the CHANGELOG's upgrade notes).
pub use outbox_sql::mysql::SCHEMA_VERSION;

/// The outbox, attempt history, inbox and relay tables on MySQL 8 or
/// MariaDB ≥ 10.6.
///
/// Enqueue takes a row lock per partition key until commit, so writers of one
/// key take turns and a key's insert order is its commit order.
/// Claims take turns on a one-row lock table and lease rows found with
/// `FOR UPDATE SKIP LOCKED` (there is no `UPDATE … RETURNING`). Relay
/// transactions run at READ COMMITTED, so they lock only the rows they
/// touch and never a gap a producer inserts into. Every time is the
/// database server's clock.
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

    /// The settings.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The schema DDL for these table names (what [`MySqlStore::migrate`] runs).
    pub fn schema_sql(&self) -> String {
        outbox_sql::mysql::schema_sql(&self.config.tables)
    }

    /// Store time: the server's clock (plus the shift tests set), in
    /// microseconds since the epoch.
    pub(super) async fn now(&self, conn: &mut MySqlConnection) -> Result<i64, StoreError> {
        sqlx::query_scalar(&self.queries.now)
            .fetch_one(conn)
            .await
            .store()
    }

    /// Tests shift store time ([`outbox_core::StoreTime::Shifted`]): the
    /// shift is kept in the database, so every handle agrees.
    pub(super) async fn sync_clock(&self) -> Result<(), StoreError> {
        if let Some(shift) = self.config.shift_micros() {
            sqlx::query(&self.queries.sync_clock)
                .bind(shift)
                .bind(shift)
                .execute(&self.pool)
                .await
                .store()?;
        }
        Ok(())
    }

    /// A transaction for the relay's own statements: READ COMMITTED, so it
    /// locks exactly the rows it reads for update and no gap between them
    /// (under REPEATABLE READ a range of the primary key would block
    /// producers' inserts until it commits).
    pub(super) async fn begin_relay(&self) -> Result<Transaction<'static, MySql>, StoreError> {
        let mut conn = self.pool.acquire().await.store()?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await
            .store()?;
        // `Pool::begin` cannot take a connection prepared this way; the
        // isolation level applies to this connection's next transaction.
        Transaction::begin(conn, None).await.store()
    }

    /// Creates the tables if missing. Idempotent; reports the schema
    /// version found and left. Tables of another schema version are refused
    /// with [`StoreError::Config`] naming the upgrade notes.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        crate::error::during("migrate", || self.config().tables.events(), async move {
            let schema = self.schema_sql();
            let mut conn = self.pool.acquire().await.store()?;
            let found = self.installed_version(&mut conn).await?;
            let migrated = crate::config::check_schema_version(
                &self.config.tables.events(),
                found,
                SCHEMA_VERSION,
            )?;
            for statement in outbox_sql::mysql::split_statements(&schema) {
                sqlx::Executor::execute(&mut *conn, statement.as_str())
                    .await
                    .store()?;
            }
            self.add_missing_indexes(&mut conn).await?;
            Ok(migrated)
        })
        .await
    }

    /// The schema version of the outbox tables: `None` if there are none,
    /// 1 for tables made before the version record existed.
    pub async fn schema_version(&self) -> Result<Option<i32>, StoreError> {
        let mut conn = self.pool.acquire().await.store()?;
        self.installed_version(&mut conn).await
    }

    async fn installed_version(
        &self,
        conn: &mut MySqlConnection,
    ) -> Result<Option<i32>, StoreError> {
        let tables = &self.config.tables;
        let present = |name: String| {
            let (database, table) = match name.split_once('.') {
                Some((d, t)) => (Some(d.to_owned()), t.to_owned()),
                None => (None, name),
            };
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM information_schema.tables
                 WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?",
            )
            .bind(database)
            .bind(table)
        };
        let events = present(tables.events())
            .fetch_one(&mut *conn)
            .await
            .store()?
            > 0;
        let record = present(tables.table("schema_version"))
            .fetch_one(&mut *conn)
            .await
            .store()?
            > 0;
        let version: Option<i32> = if events && record {
            sqlx::query_scalar(&format!(
                "SELECT MAX(version) FROM {}",
                tables.table("schema_version")
            ))
            .fetch_one(&mut *conn)
            .await
            .store()?
        } else {
            None
        };
        Ok(outbox_sql::config::installed_version(
            events, record, version,
        ))
    }

    /// Indexes added to schema version 2 after its first release: `CREATE
    /// TABLE IF NOT EXISTS` leaves tables made before them as they were, and
    /// MySQL has no `CREATE INDEX IF NOT EXISTS`.
    async fn add_missing_indexes(&self, conn: &mut MySqlConnection) -> Result<(), StoreError> {
        let tables = &self.config.tables;
        let events = tables.events();
        let (database, table) = match events.split_once('.') {
            Some((d, t)) => (Some(d.to_owned()), t.to_owned()),
            None => (None, events.clone()),
        };
        let index = format!("{}_events_key_due", tables.prefix());
        let present: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.statistics
             WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? AND index_name = ?",
        )
        .bind(database)
        .bind(table)
        .bind(&index)
        .fetch_one(&mut *conn)
        .await
        .store()?;
        if present == 0 {
            sqlx::Executor::execute(
                &mut *conn,
                format!(
                    "ALTER TABLE {events} ADD KEY {index} (partition_key, status, available_at)"
                )
                .as_str(),
            )
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
        crate::error::during("enqueue", || self.config().tables.events(), async move {
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

            let now = self.now(&mut *conn).await?;
            // Rows this call writes carry its mark: a concurrent enqueue of the
            // same id (which waits for ours, then leaves the row alone) reads
            // another mark back, whatever its snapshot.
            let mark = i64::from_le_bytes(
                EventId::random().as_uuid().as_bytes()[..8]
                    .try_into()
                    .expect("eight bytes"),
            );
            let mut insert = self.queries.enqueue_head.clone();
            let mut seen = HashSet::new();
            let fresh: Vec<&NewEvent> = events.iter().filter(|e| seen.insert(e.event_id)).collect();
            insert.push_str(&vec![self.queries.enqueue_row; fresh.len()].join(", "));
            insert.push_str(self.queries.enqueue_tail);
            let mut query = sqlx::query(&insert);
            for e in &fresh {
                let available_at = now + self.config.delay_ms(e.available_at).unwrap_or(0) * 1000;
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
                    .bind(available_at)
                    .bind(mark);
            }
            query.execute(&mut *conn).await.store()?;
            let ids: Vec<String> = fresh.iter().map(|e| e.event_id.to_string()).collect();
            let read_back = with_in_list(&self.queries.read_back, ids.len());
            let mut ours: HashMap<EventId, i64> = HashMap::new();
            for r in query_in(&read_back, &ids)
                .fetch_all(&mut *conn)
                .await
                .store()?
            {
                if r.try_get::<i64, _>("enqueue_mark").store()? == mark {
                    ours.insert(
                        row::event_id(&r, "event_id")?,
                        r.try_get("sequence").store()?,
                    );
                }
            }
            Ok(events
                .iter()
                .map(|e| match ours.remove(&e.event_id) {
                    Some(sequence) => EnqueueOutcome::Inserted { sequence },
                    None => EnqueueOutcome::AlreadyExists,
                })
                .collect())
        })
        .await
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
        let now = self.now(&mut *conn).await?;
        sqlx::query(&self.queries.record_many)
            .bind(now)
            .bind(HistoryEntry::batch_json(entries))
            .execute(conn)
            .await
            .store()?;
        Ok(())
    }

    /// Locks the rows of `leases` and returns those the lease still holds
    /// (token matches, in flight).
    async fn lock_leased(
        &self,
        tx: &mut Transaction<'static, MySql>,
        leases: &[&Lease],
    ) -> Result<Vec<Held>, StoreError> {
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
                held.push(Held {
                    sequence,
                    event_id: row::event_id(r, "event_id")?,
                    owner: row::text(r, "lease_owner")?,
                    attempts: i64::from(r.try_get::<i32, _>("attempts").store()?),
                    lease_id: r.try_get("lease_id").store()?,
                    suspect: r.try_get("suspect").store()?,
                });
            }
        }
        Ok(held)
    }
}

/// A leased row a settlement found still held by its lease.
pub(super) struct Held {
    sequence: i64,
    event_id: EventId,
    owner: String,
    attempts: i64,
    lease_id: i64,
    suspect: bool,
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
        crate::error::during("enqueue", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let mut tx = self.pool.begin().await.store()?;
            let outcomes = MySqlStore::enqueue(self, &mut tx, events).await?;
            tx.commit().await.store()?;
            Ok(outcomes)
        })
        .await
    }
}

#[async_trait]
impl OutboxStore for MySqlStore {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        crate::error::during(
            "claim_batch",
            || self.config().tables.events(),
            async move {
                self.sync_clock().await?;
                let mut tx = self.begin_relay().await?;
                // One claimer at a time: concurrent claims could split a key's prefix.
                sqlx::query(&self.queries.claim_lock)
                    .execute(&mut *tx)
                    .await
                    .store()?;
                let now = self.now(&mut tx).await?;
                let expires = now.saturating_add(
                    i64::try_from(request.lease_duration.as_micros()).unwrap_or(i64::MAX),
                );
                self.reap(&mut tx, now).await?;
                let block = request.poison == PoisonPolicy::Block;
                let crash_looped = self.fail_crash_loops(&mut tx, request, now).await?;

                let (query, ordered) = match request.ordering {
                    Ordering::PerKey => (&self.queries.claim_candidates_per_key, true),
                    Ordering::Unordered => (&self.queries.claim_candidates_unordered, false),
                };
                let mut candidates = sqlx::query(query).bind(now);
                if ordered {
                    candidates = candidates.bind(now).bind(now);
                }
                let candidates: Vec<(i64, String, bool)> = candidates
                    .bind(request.limit.min(i64::MAX as usize) as i64)
                    .fetch_all(&mut *tx)
                    .await
                    .store()?
                    .iter()
                    .map(|r| {
                        Ok((
                            r.try_get("sequence").store()?,
                            row::text(r, "partition_key")?,
                            r.try_get("suspect").store()?,
                        ))
                    })
                    .collect::<Result<_, StoreError>>()?;
                let sequences: Vec<i64> = candidates.iter().map(|(s, _, _)| *s).collect();
                let locked: HashSet<i64> = self
                    .lock_claimable(&mut tx, &sequences, now)
                    .await?
                    .into_iter()
                    .collect();
                // A row skipped as locked (a settlement in progress), a second crash
                // suspect, or a row that does not decode under Block ends its key's
                // prefix: nothing after it may be leased in this batch.
                let rows: HashMap<i64, (i64, Result<outbox_core::StoredEvent, UnreadableEvent>)> =
                    self.read_rows(&mut tx, &locked.iter().copied().collect::<Vec<_>>())
                        .await?;
                let mut stopped: HashSet<&str> = HashSet::new();
                let mut suspect_taken = false;
                let mut chosen = Vec::new();
                let mut unreadable = Vec::new();
                for (sequence, key, suspect) in &candidates {
                    if ordered && stopped.contains(key.as_str()) {
                        continue;
                    }
                    let Some((_, decoded)) = rows.get(sequence) else {
                        stopped.insert(key);
                        continue;
                    };
                    if *suspect {
                        if suspect_taken {
                            stopped.insert(key);
                            continue;
                        }
                        suspect_taken = true;
                    }
                    match decoded {
                        Ok(_) => chosen.push(*sequence),
                        Err(bad) => {
                            unreadable.push(bad.clone());
                            if block {
                                stopped.insert(key);
                            }
                        }
                    }
                }
                self.fail_unreadable(&mut tx, &unreadable, block, request.owner.as_str())
                    .await?;
                let mut events = Vec::new();
                if !chosen.is_empty() {
                    let lease = with_in_list(&self.queries.lease_rows, chosen.len());
                    let owner = request.owner.as_str();
                    chosen
                        .iter()
                        .fold(
                            sqlx::query(&lease)
                                .bind(new_lease_id())
                                .bind(owner)
                                .bind(expires),
                            |q, s| q.bind(s),
                        )
                        .execute(&mut *tx)
                        .await
                        .store()?;
                    let lease_expires_at = row::from_micros(expires)?;
                    for sequence in &chosen {
                        let (token, decoded) = &rows[sequence];
                        let event = decoded.clone().expect("chosen rows decode");
                        events.push(ClaimedEvent {
                            lease: Lease {
                                sequence: *sequence,
                                event_id: event.event_id,
                                fencing_token: FencingToken(token + 1),
                                lease_expires_at,
                            },
                            event,
                        });
                    }
                }
                tx.commit().await.store()?;
                Ok(ClaimedBatch {
                    events,
                    crash_looped,
                    unreadable,
                })
            },
        )
        .await
    }

    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        crate::error::during("ack", || self.config().tables.events(), async move {
            if leases.is_empty() {
                return Ok(SettleReport::default());
            }
            self.sync_clock().await?;
            let mut tx = self.begin_relay().await?;
            let report = self.ack_in(&mut tx, leases).await?;
            tx.commit().await.store()?;
            Ok(report)
        })
        .await
    }

    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        crate::error::during("nack", || self.config().tables.events(), async move {
            if nacks.is_empty() {
                return Ok(SettleReport::default());
            }
            self.sync_clock().await?;
            let mut tx = self.begin_relay().await?;
            let held = self
                .lock_leased(&mut tx, &nacks.iter().map(|n| &n.lease).collect::<Vec<_>>())
                .await?;
            let by_id: HashMap<EventId, &Nack> =
                nacks.iter().map(|n| (n.lease.event_id, n)).collect();
            if !held.is_empty() {
                let now = self.now(&mut tx).await?;
                let batch: Vec<_> = held
                    .iter()
                    .map(|h| {
                        let (status, blocks, available) = match &by_id[&h.event_id].action {
                            NackAction::Retry { after } => (
                                codes::PENDING,
                                false,
                                Some(now.saturating_add(
                                    i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
                                )),
                            ),
                            NackAction::Fail { block_key, .. } => (codes::FAILED, *block_key, None),
                        };
                        json!({"s": h.sequence, "st": status, "b": blocks, "a": available})
                    })
                    .collect();
                let sequences: Vec<i64> = held.iter().map(|h| h.sequence).collect();
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
                    .map(|h| {
                        let nack = by_id[&h.event_id];
                        HistoryEntry {
                            event_id: h.event_id,
                            kind: codes::nack_kind(&nack.action),
                            actor: h.owner.as_str(),
                            error_class: Some(nack.error_class.as_str()),
                            detail: nack.error.as_str(),
                            attempts: h.attempts + 1,
                        }
                    })
                    .collect();
                self.record(&mut tx, &entries).await?;
            }
            tx.commit().await.store()?;
            let settled = held.into_iter().map(|h| h.event_id).collect();
            Ok(report(nacks.iter().map(|n| n.lease.event_id), &settled))
        })
        .await
    }

    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        crate::error::during("release", || self.config().tables.events(), async move {
            if releases.is_empty() {
                return Ok(SettleReport::default());
            }
            let mut tx = self.begin_relay().await?;
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
                // Rows whose publishing had started are blamed as after a crash.
                let blamed: HashMap<i64, i64> = blame(
                    &held
                        .iter()
                        .filter(|h| started[&h.sequence])
                        .map(|h| (h.sequence, h.lease_id, h.suspect))
                        .collect::<Vec<_>>(),
                )
                .into_iter()
                .collect();
                let batch: Vec<_> = held
                    .iter()
                    .map(|h| {
                        json!([
                            h.sequence,
                            started[&h.sequence],
                            blamed.get(&h.sequence).copied().unwrap_or(0)
                        ])
                    })
                    .collect();
                let sequences: Vec<i64> = held.iter().map(|h| h.sequence).collect();
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
            let settled = held.into_iter().map(|h| h.event_id).collect();
            Ok(report(releases.iter().map(|r| r.lease.event_id), &settled))
        })
        .await
    }

    async fn heartbeat(&self, relay: &RelayId) -> Result<(), StoreError> {
        crate::error::during("heartbeat", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let mut conn = self.pool.acquire().await.store()?;
            let now = self.now(&mut conn).await?;
            let skew_ms = (self.config.clock.now().timestamp_micros() - now) / 1000;
            sqlx::query(&self.queries.heartbeat)
                .bind(relay.as_str())
                .bind(now)
                .bind(skew_ms)
                .execute(&mut *conn)
                .await
                .store()?;
            Ok(())
        })
        .await
    }
}

impl MySqlStore {
    /// Acks `leases` in `tx` (a relay transaction; tests hold one open).
    pub(super) async fn ack_in(
        &self,
        tx: &mut Transaction<'static, MySql>,
        leases: &[Lease],
    ) -> Result<SettleReport, StoreError> {
        let held = self
            .lock_leased(tx, &leases.iter().collect::<Vec<_>>())
            .await?;
        let sequences: Vec<i64> = held.iter().map(|h| h.sequence).collect();
        if !sequences.is_empty() {
            let ack = with_in_list(&self.queries.ack, sequences.len());
            let now = self.now(tx).await?;
            sequences
                .iter()
                .fold(sqlx::query(&ack).bind(now), |q, s| q.bind(s))
                .execute(&mut **tx)
                .await
                .store()?;
            // A published replacement lifts the block of the event it superseded.
            let ids: Vec<String> = held.iter().map(|h| h.event_id.to_string()).collect();
            let unblock = with_in_list(&self.queries.unblock_superseded, ids.len());
            query_in(&unblock, &ids).execute(&mut **tx).await.store()?;
        }
        let settled = held.into_iter().map(|h| h.event_id).collect();
        Ok(report(leases.iter().map(|l| l.event_id), &settled))
    }

    /// Leases that expired with rows in flight: the rows go back to
    /// pending and the crash is blamed ([`outbox_core::store::crash_culprit`]).
    async fn reap(&self, tx: &mut Transaction<'static, MySql>, now: i64) -> Result<(), StoreError> {
        // Read without locking (a locking scan of the status index
        // deadlocks with settlements), then lock the expired rows by
        // primary key, skipping any a settlement holds right now.
        let in_flight: Vec<InFlight> = sqlx::query(&self.queries.in_flight)
            .fetch_all(&mut **tx)
            .await
            .store()?
            .iter()
            .map(|r| {
                Ok(InFlight {
                    sequence: r.try_get("sequence").store()?,
                    lease_id: r.try_get("lease_id").store()?,
                    owner: row::text(r, "lease_owner")?,
                    expires_at: r
                        .try_get::<Option<i64>, _>("lease_expires_at")
                        .store()?
                        .unwrap_or(0),
                    unstarted: r.try_get("lease_unstarted").store()?,
                    suspect: r.try_get("suspect").store()?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        let reaping = reap(&in_flight, now);
        let expired: Vec<i64> = reaping
            .blamed
            .iter()
            .map(|(s, _)| *s)
            .chain(reaping.returned.iter().copied())
            .collect();
        if expired.is_empty() {
            return Ok(());
        }
        let lock = with_in_list(&self.queries.lock_expired, expired.len());
        let locked: HashSet<i64> = expired
            .iter()
            .fold(sqlx::query_scalar(&lock).bind(now), |q, s| q.bind(s))
            .fetch_all(&mut **tx)
            .await
            .store()?
            .into_iter()
            .collect();
        let blamed: Vec<(i64, i64)> = reaping
            .blamed
            .into_iter()
            .filter(|(s, _)| locked.contains(s))
            .collect();
        if !blamed.is_empty() {
            let sequences: Vec<i64> = blamed.iter().map(|(s, _)| *s).collect();
            let update = with_in_list(&self.queries.reap, sequences.len());
            let batch =
                Value::Array(blamed.iter().map(|(s, c)| json!([s, c])).collect()).to_string();
            sequences
                .iter()
                .fold(sqlx::query(&update).bind(batch), |q, s| q.bind(s))
                .execute(&mut **tx)
                .await
                .store()?;
        }
        let returned: Vec<i64> = reaping
            .returned
            .into_iter()
            .filter(|s| locked.contains(s))
            .collect();
        for (query, rows) in [
            (&self.queries.return_rows, returned),
            (&self.queries.mark_unstarted, reaping.unstarted),
        ] {
            if !rows.is_empty() {
                let update = with_in_list(query, rows.len());
                query_in(&update, &rows).execute(&mut **tx).await.store()?;
            }
        }
        Ok(())
    }

    /// Rows blamed for `crash_loop_limit` crashes, at the head of their key,
    /// end failed.
    async fn fail_crash_loops(
        &self,
        tx: &mut Transaction<'static, MySql>,
        request: &ClaimRequest,
        now: i64,
    ) -> Result<Vec<outbox_core::StoredEvent>, StoreError> {
        let looped: Vec<i64> = sqlx::query_scalar(&self.queries.crash_loop_candidates)
            .bind(i64::from(request.crash_loop_limit))
            .bind(now)
            .fetch_all(&mut **tx)
            .await
            .store()?;
        let looped = self.lock_claimable(tx, &looped, now).await?;
        if looped.is_empty() {
            return Ok(Vec::new());
        }
        let fail = with_in_list(&self.queries.fail_rows, looped.len());
        looped
            .iter()
            .fold(
                sqlx::query(&fail).bind(request.poison == PoisonPolicy::Block),
                |q, s| q.bind(s),
            )
            .execute(&mut **tx)
            .await
            .store()?;
        let events: Vec<_> = self
            .read_rows(tx, &looped)
            .await?
            .into_values()
            .map(|(_, decoded)| decoded.unwrap_or_else(|u| u.event))
            .collect();
        let detail = format!(
            "{} publish attempts started and none finished",
            request.crash_loop_limit
        );
        let entries: Vec<_> = events
            .iter()
            .map(|e| HistoryEntry {
                event_id: e.event_id,
                kind: AttemptKind::CrashLoop,
                actor: request.owner.as_str(),
                error_class: None,
                detail: detail.as_str(),
                attempts: i64::from(e.attempts),
            })
            .collect();
        self.record(tx, &entries).await?;
        Ok(events)
    }

    /// Fails rows that do not decode, each on its own (history kind
    /// `Unreadable`).
    async fn fail_unreadable(
        &self,
        tx: &mut Transaction<'static, MySql>,
        unreadable: &[UnreadableEvent],
        block: bool,
        actor: &str,
    ) -> Result<(), StoreError> {
        if unreadable.is_empty() {
            return Ok(());
        }
        let sequences: Vec<i64> = unreadable.iter().map(|u| u.event.sequence).collect();
        let fail = with_in_list(&self.queries.fail_rows, sequences.len());
        sequences
            .iter()
            .fold(sqlx::query(&fail).bind(block), |q, s| q.bind(s))
            .execute(&mut **tx)
            .await
            .store()?;
        let entries: Vec<_> = unreadable
            .iter()
            .map(|u| HistoryEntry {
                event_id: u.event.event_id,
                kind: AttemptKind::Unreadable,
                actor,
                error_class: None,
                detail: u.reason.as_str(),
                attempts: i64::from(u.event.attempts),
            })
            .collect();
        self.record(tx, &entries).await
    }

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
            .fold(sqlx::query_scalar(&lock).bind(now), |q, s| q.bind(s))
            .fetch_all(&mut **tx)
            .await
            .store()
    }

    /// The rows, each with its current fencing token, decoded one by one.
    #[allow(clippy::type_complexity)]
    async fn read_rows(
        &self,
        tx: &mut Transaction<'static, MySql>,
        sequences: &[i64],
    ) -> Result<HashMap<i64, (i64, Result<outbox_core::StoredEvent, UnreadableEvent>)>, StoreError>
    {
        if sequences.is_empty() {
            return Ok(HashMap::new());
        }
        let read = with_in_list(&self.queries.read_rows, sequences.len());
        query_in(&read, sequences)
            .fetch_all(&mut **tx)
            .await
            .store()?
            .iter()
            .map(|r| {
                let token: i64 = r.try_get("fencing_token").store()?;
                let raw = row::raw_event(r)?;
                Ok((raw.sequence, (token, raw.decode())))
            })
            .collect()
    }
}
