//! [`SqliteStore`]: the outbox on SQLite.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::store::{
    AttemptKind, ClaimRequest, ClaimedBatch, ClaimedEvent, CrashVerdict, EnqueueOutcome,
    FencingToken, Heartbeat, Lease, Nack, NackAction, OutboxStore, OutboxWriter, Release,
    SettleReport, SuspectAllowance,
};
use outbox_core::{
    EventId, NewEvent, Ordering, PoisonPolicy, StoreError, StoredEvent, UnreadableEvent,
};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool, Transaction};

use super::queries::Queries;
use super::row;
use crate::blame::{InFlight, blame, new_lease_id, reap, suspect_span};
use crate::codes;
use crate::config::{Migrated, StoreConfig};
use crate::error::ResultExt;
use crate::history::HistoryEntry;
use crate::validate::{check_event, headers_json};

/// The version of the schema the store creates; tables of another version
/// are refused by `migrate` (see the CHANGELOG's upgrade notes).
pub use outbox_sql::sqlite::SCHEMA_VERSION;

/// The outbox, attempt history, inbox and relay tables in a SQLite file.
///
/// SQLite has one writer at a time: claims run in `BEGIN IMMEDIATE`
/// transactions, so leases and fencing hold across every process sharing the
/// file (open it in WAL mode with a busy timeout, as [`SqliteStore::open`]
/// does), and insert order is commit order. Store time is the clock of the
/// host the file is on, read in SQL (never a clock a caller injects).
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

    /// The settings.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The statement that finds a claim's candidates, for `EXPLAIN QUERY
    /// PLAN` and review. Parameters: `?1` now (microseconds), `?2` limit.
    pub fn claim_statement(&self, ordering: Ordering) -> &str {
        match ordering {
            Ordering::PerKey => &self.queries.claim_per_key,
            Ordering::Unordered => &self.queries.claim_unordered,
        }
    }

    /// The schema DDL for these table names (what [`SqliteStore::migrate`] runs).
    pub fn schema_sql(&self) -> String {
        outbox_sql::sqlite::schema_sql(&self.config.tables)
    }

    /// Creates the tables and indexes if missing. Idempotent; reports the
    /// schema version found and left. Tables of another schema version are
    /// refused with [`StoreError::Config`] naming the upgrade notes.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        crate::error::during("migrate", || self.config().tables.events(), async move {
            let schema = self.schema_sql();
            let mut tx = self.begin_immediate().await?;
            let found = self.installed_version(&mut tx).await?;
            let migrated = crate::config::check_schema_version(
                &self.config.tables.events(),
                found,
                SCHEMA_VERSION,
            )?;
            sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&schema))
                .await
                .store()?;
            for (suffix, column, definition) in outbox_sql::sqlite::ADDED_COLUMNS {
                let table = self.config.tables.table(suffix);
                let present: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2",
                )
                .bind(&table)
                .bind(column)
                .fetch_one(&mut *tx)
                .await
                .store()?;
                if present == 0 {
                    sqlx::query(&format!(
                        "ALTER TABLE {table} ADD COLUMN {column} {definition}"
                    ))
                    .execute(&mut *tx)
                    .await
                    .store()?;
                }
            }
            tx.commit().await.store()?;
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
        conn: &mut SqliteConnection,
    ) -> Result<Option<i32>, StoreError> {
        let tables = &self.config.tables;
        let present = |name: String| {
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            )
            .bind(name)
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

    /// Store time: this host's clock (plus the shift tests set), in
    /// microseconds since the epoch.
    pub(super) async fn now(&self, conn: &mut SqliteConnection) -> Result<i64, StoreError> {
        sqlx::query_scalar(&self.queries.now)
            .fetch_one(conn)
            .await
            .store()
    }

    /// Tests shift store time ([`outbox_core::StoreTime::Shifted`]): the
    /// shift is kept in the database, so every handle agrees.
    pub(super) async fn sync_clock(&self) -> Result<(), StoreError> {
        if let Some(shift) = self.config.shift_micros() {
            let current: i64 = sqlx::query_scalar(&format!(
                "SELECT clock_shift_us FROM {} WHERE id = 1",
                self.config.tables.table("control")
            ))
            .fetch_one(&self.pool)
            .await
            .store()?;
            if current != shift {
                let mut tx = self.begin_immediate().await?;
                sqlx::query(&self.queries.sync_clock)
                    .bind(shift)
                    .execute(&mut *tx)
                    .await
                    .store()?;
                tx.commit().await.store()?;
            }
        }
        Ok(())
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
        crate::error::during("enqueue", || self.config().tables.events(), async move {
            for event in events {
                check_event(event, &self.config.limits, false)?;
            }
            if events.is_empty() {
                return Ok(Vec::new());
            }
            // No clock sync here: it would write, and the caller's transaction
            // holds SQLite's one write lock.
            let now = self.now(&mut *conn).await?;
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
                        "d": self.config.delay_ms(e.available_at),
                    })
                })
                .collect();
            let rows = sqlx::query(&self.queries.enqueue)
                .bind(serde_json::Value::Array(batch).to_string())
                .bind(now)
                .fetch_all(&mut *conn)
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
        })
        .await
    }

    /// Appends history rows in one statement.
    pub(super) async fn record(
        &self,
        conn: &mut SqliteConnection,
        entries: &[HistoryEntry<'_>],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let now = self.now(&mut *conn).await?;
        sqlx::query(&self.queries.record_many)
            .bind(HistoryEntry::batch_json(entries))
            .bind(now)
            .execute(&mut *conn)
            .await
            .store()?;
        Ok(())
    }

    async fn settle_json(
        &self,
        query: &str,
        batch: serde_json::Value,
        with_now: bool,
        asked: impl Iterator<Item = EventId>,
    ) -> Result<SettleReport, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let mut q = sqlx::query(query).bind(batch.to_string());
        if with_now {
            q = q.bind(self.now(&mut tx).await?);
        }
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
        crate::error::during("enqueue", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let mut tx = self.begin_immediate().await?;
            let outcomes = SqliteStore::enqueue(self, &mut tx, events).await?;
            tx.commit().await.store()?;
            Ok(outcomes)
        })
        .await
    }
}

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        crate::error::during(
            "claim_batch",
            || self.config().tables.events(),
            async move {
                self.sync_clock().await?;
                let mut tx = self.begin_immediate().await?;
                let now = self.now(&mut tx).await?;
                let expires = now.saturating_add(
                    i64::try_from(request.lease_duration.as_micros()).unwrap_or(i64::MAX),
                );
                self.reap(&mut tx, now).await?;
                let block = request.poison == PoisonPolicy::Block;
                let looped = sqlx::query(&self.queries.crash_loops)
                    .bind(now)
                    .bind(i64::from(request.crash_loop_limit))
                    .bind(block)
                    .fetch_all(&mut *tx)
                    .await
                    .store()?;
                let crash_looped: Vec<StoredEvent> = looped
                    .iter()
                    .map(|r| Ok(row::raw_event(r)?.decode().unwrap_or_else(|u| u.event)))
                    .collect::<Result<_, StoreError>>()?;
                let detail = format!(
                    "{} publish attempts started and none finished",
                    request.crash_loop_limit
                );
                let entries: Vec<_> = crash_looped
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
                self.record(&mut tx, &entries).await?;

                let (query, ordered) = match request.ordering {
                    Ordering::PerKey => (&self.queries.claim_per_key, true),
                    Ordering::Unordered => (&self.queries.claim_unordered, false),
                };
                let candidates: Vec<(i64, String, Option<u32>)> = sqlx::query(query)
                    .bind(now)
                    .bind(request.limit.min(i64::MAX as usize) as i64)
                    .fetch_all(&mut *tx)
                    .await
                    .store()?
                    .iter()
                    .map(|r| {
                        Ok((
                            r.try_get("sequence").store()?,
                            r.try_get("partition_key").store()?,
                            suspect_span(
                                r.try_get("suspect").store()?,
                                r.try_get("suspect_span").store()?,
                            ),
                        ))
                    })
                    .collect::<Result<_, StoreError>>()?;
                let sequences: Vec<i64> = candidates.iter().map(|(s, _, _)| *s).collect();
                let mut rows: HashMap<i64, (i64, Result<StoredEvent, UnreadableEvent>)> =
                    HashMap::new();
                for r in sqlx::query(&self.queries.read_rows)
                    .bind(json!(sequences).to_string())
                    .fetch_all(&mut *tx)
                    .await
                    .store()?
                {
                    let raw = row::raw_event(&r)?;
                    rows.insert(
                        raw.sequence,
                        (r.try_get("fencing_token").store()?, raw.decode()),
                    );
                }
                // A crash suspect beyond the lease's allowance, or a row that
                // does not decode under Block, ends its key's prefix in this
                // batch.
                let mut stopped: HashSet<&str> = HashSet::new();
                let mut suspects = SuspectAllowance::default();
                let mut chosen = Vec::new();
                let mut unreadable = Vec::new();
                for (sequence, key, suspect) in &candidates {
                    if ordered && stopped.contains(key.as_str()) {
                        continue;
                    }
                    if let Some(span) = suspect {
                        if !suspects.admit(*span) {
                            stopped.insert(key);
                            continue;
                        }
                    }
                    match &rows[sequence].1 {
                        Ok(_) => chosen.push(*sequence),
                        Err(bad) => {
                            unreadable.push(bad.clone());
                            if block {
                                stopped.insert(key);
                            }
                        }
                    }
                }
                if !unreadable.is_empty() {
                    let bad: Vec<i64> = unreadable.iter().map(|u| u.event.sequence).collect();
                    sqlx::query(&self.queries.fail_rows)
                        .bind(json!(bad).to_string())
                        .bind(block)
                        .execute(&mut *tx)
                        .await
                        .store()?;
                    let entries: Vec<_> = unreadable
                        .iter()
                        .map(|u| HistoryEntry {
                            event_id: u.event.event_id,
                            kind: AttemptKind::Unreadable,
                            actor: request.owner.as_str(),
                            error_class: None,
                            detail: u.reason.as_str(),
                            attempts: i64::from(u.event.attempts),
                        })
                        .collect();
                    self.record(&mut tx, &entries).await?;
                }
                let mut events = Vec::with_capacity(chosen.len());
                if !chosen.is_empty() {
                    sqlx::query(&self.queries.lease_rows)
                        .bind(json!(chosen).to_string())
                        .bind(new_lease_id())
                        .bind(request.owner.as_str())
                        .bind(expires)
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
            let batch = leases
                .iter()
                .map(|l| json!([l.sequence, l.fencing_token.0]))
                .collect();
            self.settle_json(
                &self.queries.ack,
                batch,
                true,
                leases.iter().map(|l| l.event_id),
            )
            .await
        })
        .await
    }

    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        crate::error::during("nack", || self.config().tables.events(), async move {
            if nacks.is_empty() {
                return Ok(SettleReport::default());
            }
            self.sync_clock().await?;
            let mut tx = self.begin_immediate().await?;
            let now = self.now(&mut tx).await?;
            let batch: Vec<_> = nacks
                .iter()
                .map(|n| {
                    let (status, blocks, available) = match &n.action {
                        NackAction::Retry { after } => (
                            codes::PENDING,
                            false,
                            Some(now.saturating_add(
                                i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
                            )),
                        ),
                        NackAction::Fail { block_key, .. } => (codes::FAILED, *block_key, None),
                    };
                    json!({"s": n.lease.sequence, "t": n.lease.fencing_token.0, "st": status,
                           "b": blocks, "a": available})
                })
                .collect();
            let rows = sqlx::query(&self.queries.nack)
                .bind(serde_json::Value::Array(batch).to_string())
                .fetch_all(&mut *tx)
                .await
                .store()?;
            let by_id: HashMap<EventId, &Nack> =
                nacks.iter().map(|n| (n.lease.event_id, n)).collect();
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
        })
        .await
    }

    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        crate::error::during("release", || self.config().tables.events(), async move {
            if releases.is_empty() {
                return Ok(SettleReport::default());
            }
            let mut tx = self.begin_immediate().await?;
            // Rows whose publishing had started are blamed as after a crash.
            let started: Vec<i64> = releases
                .iter()
                .filter(|r| r.attempt_started)
                .map(|r| r.lease.sequence)
                .collect();
            let mut judged: HashMap<i64, CrashVerdict> = HashMap::new();
            if !started.is_empty() {
                let held: Vec<(i64, i64, Option<u32>)> = sqlx::query(&self.queries.held)
                    .bind(json!(started).to_string())
                    .fetch_all(&mut *tx)
                    .await
                    .store()?
                    .iter()
                    .map(|r| {
                        Ok((
                            r.try_get("sequence").store()?,
                            r.try_get("lease_id").store()?,
                            suspect_span(
                                r.try_get("suspect").store()?,
                                r.try_get("suspect_span").store()?,
                            ),
                        ))
                    })
                    .collect::<Result<_, StoreError>>()?;
                judged = blame(&held).into_iter().map(|v| (v.sequence, v)).collect();
            }
            let batch: Vec<_> = releases
                .iter()
                .map(|r| {
                    let verdict = judged.get(&r.lease.sequence);
                    json!([
                        r.lease.sequence,
                        r.lease.fencing_token.0,
                        r.attempt_started,
                        i64::from(verdict.is_some_and(|v| v.blamed)),
                        verdict.map_or(0, |v| v.suspect_span)
                    ])
                })
                .collect();
            let rows = sqlx::query(&self.queries.release)
                .bind(serde_json::Value::Array(batch).to_string())
                .fetch_all(&mut *tx)
                .await
                .store()?;
            tx.commit().await.store()?;
            let settled: HashSet<EventId> = rows
                .iter()
                .map(|r| row::event_id(r, "event_id"))
                .collect::<Result<_, _>>()?;
            Ok(SettleReport {
                applied: settled.len(),
                fenced: releases
                    .iter()
                    .map(|r| r.lease.event_id)
                    .filter(|id| !settled.contains(id))
                    .collect(),
            })
        })
        .await
    }

    async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        crate::error::during("heartbeat", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let mut tx = self.begin_immediate().await?;
            let now = self.now(&mut tx).await?;
            let skew_ms = (self.config.clock.now().timestamp_micros() - now) / 1000;
            let outage = beat.outage.as_ref();
            sqlx::query(&self.queries.heartbeat)
                .bind(beat.relay.as_str())
                .bind(now)
                .bind(skew_ms)
                .bind(outage.map(|o| o.destination.as_str()))
                .bind(outage.map(|o| o.reason.as_str()))
                .execute(&mut *tx)
                .await
                .store()?;
            tx.commit().await.store()
        })
        .await
    }
}

impl SqliteStore {
    /// Leases that expired with rows in flight: the rows go back to
    /// pending and the crash is blamed ([`outbox_core::store::crash_culprit`]).
    async fn reap(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        now: i64,
    ) -> Result<(), StoreError> {
        let in_flight: Vec<InFlight> = sqlx::query(&self.queries.in_flight)
            .fetch_all(&mut **tx)
            .await
            .store()?
            .iter()
            .map(|r| {
                Ok(InFlight {
                    sequence: r.try_get("sequence").store()?,
                    lease_id: r.try_get("lease_id").store()?,
                    owner: r.try_get("lease_owner").store()?,
                    expires_at: r
                        .try_get::<Option<i64>, _>("lease_expires_at")
                        .store()?
                        .unwrap_or(0),
                    unstarted: r.try_get("lease_unstarted").store()?,
                    suspect_span: suspect_span(
                        r.try_get("suspect").store()?,
                        r.try_get("suspect_span").store()?,
                    ),
                })
            })
            .collect::<Result<_, StoreError>>()?;
        let reaping = reap(&in_flight, now);
        if !reaping.blamed.is_empty() {
            let batch: Vec<_> = reaping
                .blamed
                .iter()
                .map(|v| json!([v.sequence, i64::from(v.blamed), v.suspect_span]))
                .collect();
            sqlx::query(&self.queries.reap)
                .bind(serde_json::Value::Array(batch).to_string())
                .execute(&mut **tx)
                .await
                .store()?;
        }
        for (query, rows) in [
            (&self.queries.return_rows, &reaping.returned),
            (&self.queries.mark_unstarted, &reaping.unstarted),
        ] {
            if !rows.is_empty() {
                sqlx::query(query)
                    .bind(json!(rows).to_string())
                    .execute(&mut **tx)
                    .await
                    .store()?;
            }
        }
        Ok(())
    }
}
