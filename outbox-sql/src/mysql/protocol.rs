//! The MySQL/MariaDB store's protocol, once for every driver: which
//! statement runs when, with which parameters, and what its rows mean.
//!
//! Enqueue takes a row lock per partition key until commit, so writers of
//! one key take turns and a key's insert order is its commit order. Claims
//! take turns on a one-row lock table and lease rows found with `FOR UPDATE
//! SKIP LOCKED` (there is no `UPDATE … RETURNING`). Relay transactions run
//! at READ COMMITTED, so they lock only the rows they touch and never a gap
//! a producer inserts into. Every time is the database server's clock.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use outbox_core::store::{
    AttemptKind, ClaimRequest, ClaimedBatch, ClaimedEvent, CrashVerdict, EnqueueOutcome,
    FencingToken, Heartbeat, Lease, Nack, NackAction, Release, SettleReport, SuspectAllowance,
};
use outbox_core::{
    EventId, NewEvent, Ordering, PoisonPolicy, RawEvent, StoreError, StoredEvent, UnreadableEvent,
};
use serde_json::{Value as Json, json};

use super::driver::{Driver, Exec, Param, Row, from_micros};
use super::{MAX_LISTED_KEYS, Queries, SCHEMA_VERSION, with_in_list, with_keys_in_flight};
use crate::blame::{InFlight, blame, new_lease_id, reap, suspect_span};
use crate::codes;
use crate::config::{Migrated, StoreConfig};
pub(super) use crate::error::during;
use crate::history::HistoryEntry;
use crate::validate::{check_event, headers_json};

/// The settings and statements: what runs on a connection the caller
/// holds (enqueue, an inbox claim, migrate), with no pool of its own.
#[derive(Clone)]
pub struct Statements {
    /// The settings.
    pub config: StoreConfig,
    /// The statements for the settings' names.
    pub queries: Arc<Queries>,
}

/// The store over driver `D`: its pool, and (by `Deref`) its
/// [`Statements`].
#[derive(Clone)]
pub struct Protocol<D> {
    /// The driver's pool.
    pub driver: D,
    /// The settings and statements.
    pub statements: Statements,
}

impl<D> std::ops::Deref for Protocol<D> {
    type Target = Statements;
    fn deref(&self) -> &Statements {
        &self.statements
    }
}

impl<D> std::ops::DerefMut for Protocol<D> {
    fn deref_mut(&mut self) -> &mut Statements {
        &mut self.statements
    }
}

/// A decoded row with its current fencing token.
type ReadRow = (i64, Result<StoredEvent, UnreadableEvent>);

/// Each value as a parameter.
fn params<T: Clone + Into<Param>>(values: &[T]) -> Vec<Param> {
    values.iter().cloned().map(Into::into).collect()
}

/// `head` then each of `values`.
fn with<T: Clone + Into<Param>>(head: impl IntoIterator<Item = Param>, values: &[T]) -> Vec<Param> {
    head.into_iter().chain(params(values)).collect()
}

fn micros(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

fn limit(n: usize) -> Param {
    Param::Int(n.min(i64::MAX as usize) as i64)
}

/// The columns of [`super::EVENT_COLUMNS`], not yet trusted as an event:
/// decoding is [`RawEvent::decode`], per row.
pub fn raw_event(row: &Row) -> Result<RawEvent, StoreError> {
    Ok(RawEvent {
        sequence: row.int("sequence")?,
        event_id: row.event_id("event_id")?,
        aggregate_type: row.text("aggregate_type")?,
        aggregate_id: row.text("aggregate_id")?,
        event_type: row.text("event_type")?,
        partition_key: row.text("partition_key")?,
        payload: row.text("payload")?,
        payload_version: row.int("payload_version")?,
        headers: row.text("headers")?,
        created_at: row.time("created_at")?,
        available_at: row.time("available_at")?,
        attempts: row.int("attempts")?,
    })
}

/// Event ids as a JSON array of strings, for the statements that join
/// them with `JSON_TABLE`.
fn id_array(ids: impl Iterator<Item = EventId>) -> String {
    Json::Array(ids.map(|id| Json::String(id.to_string())).collect()).to_string()
}

/// A leased row a settlement found still held by its lease.
struct Held {
    sequence: i64,
    event_id: EventId,
    owner: String,
    attempts: i64,
    lease_id: i64,
    suspect_span: Option<u32>,
}

fn report(asked: impl Iterator<Item = EventId>, settled: &HashSet<EventId>) -> SettleReport {
    SettleReport {
        applied: settled.len(),
        fenced: asked.filter(|id| !settled.contains(id)).collect(),
    }
}

impl Statements {
    /// The statements for `config`'s tables.
    pub fn new(config: StoreConfig) -> Self {
        let queries = Arc::new(Queries::new(&config.tables));
        Self { config, queries }
    }

    /// The events table's name, for errors.
    pub fn events(&self) -> String {
        self.config.tables.events()
    }

    /// Store time: the server's clock (plus the shift tests set), in
    /// microseconds since the epoch.
    pub async fn now(&self, conn: &mut (impl Exec + ?Sized)) -> Result<i64, StoreError> {
        conn.fetch(&self.queries.now, Vec::new())
            .await?
            .first()
            .ok_or_else(|| StoreError::fatal("the clock table has no row (run migrate)"))?
            .int("now")
    }

    /// `name` (maybe `database.table`) as parameters: database, table.
    fn located(name: &str) -> Vec<Param> {
        match name.split_once('.') {
            Some((d, t)) => vec![d.into(), t.into()],
            None => vec![Param::Null, name.into()],
        }
    }

    async fn count(
        conn: &mut (impl Exec + ?Sized),
        sql: &str,
        params: Vec<Param>,
    ) -> Result<i64, StoreError> {
        let rows = conn.fetch(sql, params).await?;
        rows.first().map_or(Ok(0), |r| r.int("n"))
    }

    /// Creates the tables if missing on `conn` (outside any transaction:
    /// MySQL commits DDL at once). See [`Protocol::migrate`].
    pub async fn migrate_on(
        &self,
        conn: &mut (impl Exec + ?Sized),
    ) -> Result<Migrated, StoreError> {
        during("migrate", || self.events(), async move {
            let schema = super::schema_sql(&self.config.tables);
            let found = self.installed_version(&mut *conn).await?;
            let migrated = crate::config::check_schema_version(
                &self.config.tables.events(),
                found,
                SCHEMA_VERSION,
            )?;
            for statement in super::split_statements(&schema) {
                conn.execute(&statement, Vec::new()).await?;
            }
            self.add_columns(&mut *conn).await?;
            self.align_indexes(&mut *conn, &schema).await?;
            Ok(migrated)
        })
        .await
    }

    /// The schema version of the outbox tables on `conn`: `None` if there
    /// are none, 1 for tables made before the version record existed.
    pub async fn installed_version(
        &self,
        conn: &mut (impl Exec + ?Sized),
    ) -> Result<Option<i32>, StoreError> {
        const PRESENT: &str = "SELECT COUNT(*) AS n FROM information_schema.tables
             WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?";
        let tables = &self.config.tables;
        let events = Self::count(conn, PRESENT, Self::located(&tables.events())).await? > 0;
        let record_table = tables.table("schema_version");
        let record = Self::count(conn, PRESENT, Self::located(&record_table)).await? > 0;
        let version = if events && record {
            conn.fetch(
                &format!("SELECT MAX(version) AS version FROM {record_table}"),
                Vec::new(),
            )
            .await?
            .first()
            .map(|r| r.opt_int("version"))
            .transpose()?
            .flatten()
            .map(|v| i32::try_from(v).map_err(StoreError::fatal))
            .transpose()?
        } else {
            None
        };
        Ok(crate::config::installed_version(events, record, version))
    }

    /// Brings the events table's secondary indexes to the template's
    /// definitions ([`super::event_indexes`]): `CREATE TABLE IF NOT EXISTS`
    /// leaves tables made by an earlier release of schema version 2 as they
    /// were (MySQL has no `CREATE INDEX IF NOT EXISTS`). A missing index is
    /// added and one with other columns rebuilt, online (`LOCK = NONE`:
    /// writes go on while it builds); nothing is done when they match.
    /// Adds [`super::ADDED_COLUMNS`] an older table lacks. `INSTANT`:
    /// metadata only, no rebuild, no lock a producer waits behind.
    async fn add_columns(&self, conn: &mut (impl Exec + ?Sized)) -> Result<(), StoreError> {
        for (suffix, column, definition) in super::ADDED_COLUMNS {
            let table = self.config.tables.table(suffix);
            let mut located = Self::located(&table);
            located.push((*column).into());
            let present = Self::count(
                conn,
                "SELECT COUNT(*) AS n FROM information_schema.columns
                 WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? AND column_name = ?",
                located,
            )
            .await?;
            if present == 0 {
                conn.execute(
                    &format!(
                        "ALTER TABLE {table} ADD COLUMN {column} {definition}, ALGORITHM = INSTANT"
                    ),
                    Vec::new(),
                )
                .await?;
            }
        }
        Ok(())
    }

    async fn align_indexes(
        &self,
        conn: &mut (impl Exec + ?Sized),
        schema: &str,
    ) -> Result<(), StoreError> {
        let events = self.config.tables.events();
        for (index, columns) in super::event_indexes(schema) {
            let mut located = Self::located(&events);
            located.push(index.as_str().into());
            let found = conn
                .fetch(
                    "SELECT GROUP_CONCAT(column_name ORDER BY seq_in_index SEPARATOR ', ') AS columns
                     FROM information_schema.statistics
                     WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? AND index_name = ?",
                    located,
                )
                .await?
                .first()
                .map(|r| r.opt_text("columns"))
                .transpose()?
                .flatten();
            let change = match found.as_deref() {
                Some(present) if present == columns => continue,
                Some(_) => format!("DROP INDEX {index}, ADD KEY {index} ({columns})"),
                None => format!("ADD KEY {index} ({columns})"),
            };
            conn.execute(
                &format!("ALTER TABLE {events} {change}, ALGORITHM = INPLACE, LOCK = NONE"),
                Vec::new(),
            )
            .await?;
        }
        Ok(())
    }

    /// Enqueues `events` on `conn`, typically the business transaction.
    /// Locks the events' partition keys until that transaction ends.
    /// Invalid events are refused before anything is sent, so the
    /// transaction stays usable.
    pub async fn enqueue(
        &self,
        conn: &mut (impl Exec + ?Sized),
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        during("enqueue", || self.events(), async move {
            for event in events {
                check_event(event, &self.config.limits, false)?;
            }
            if events.is_empty() {
                return Ok(Vec::new());
            }
            // Sorted, so two transactions locking overlapping keys cannot deadlock.
            let keys: BTreeSet<&str> = events.iter().map(|e| e.partition_key.as_str()).collect();
            let mut lock = self.queries.lock_keys.clone();
            lock.push_str(&vec!["(?)"; keys.len()].join(", "));
            lock.push_str(" ON DUPLICATE KEY UPDATE partition_key = partition_key");
            conn.execute(&lock, keys.iter().map(|k| Param::from(*k)).collect())
                .await?;

            let now = self.now(&mut *conn).await?;
            // Rows this call writes carry its mark: a concurrent enqueue of the
            // same id (which waits for ours, then leaves the row alone) reads
            // another mark back, whatever its snapshot.
            let mark = i64::from_le_bytes(
                EventId::random().as_uuid().as_bytes()[..8]
                    .try_into()
                    .expect("eight bytes"),
            );
            let mut seen = HashSet::new();
            let fresh: Vec<&NewEvent> = events.iter().filter(|e| seen.insert(e.event_id)).collect();
            let mut insert = self.queries.enqueue_head.clone();
            insert.push_str(&vec![self.queries.enqueue_row; fresh.len()].join(", "));
            insert.push_str(self.queries.enqueue_tail);
            let mut values = Vec::with_capacity(fresh.len() * 11);
            for e in &fresh {
                let available_at = now + self.config.delay_ms(e.available_at).unwrap_or(0) * 1000;
                values.extend([
                    e.event_id.to_string().into(),
                    e.aggregate_type.as_str().into(),
                    e.aggregate_id.as_str().into(),
                    e.event_type.as_str().into(),
                    e.partition_key.as_str().into(),
                    e.payload.as_str().into(),
                    e.payload_version.into(),
                    headers_json(e).into(),
                    now.into(),
                    available_at.into(),
                    mark.into(),
                ]);
            }
            conn.execute(&insert, values).await?;
            let ids = id_array(fresh.iter().map(|e| e.event_id));
            let mut ours: HashMap<EventId, i64> = HashMap::new();
            for r in conn
                .fetch(&self.queries.read_back, vec![ids.into()])
                .await?
            {
                if r.int("enqueue_mark")? == mark {
                    ours.insert(r.event_id("event_id")?, r.int("sequence")?);
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
    pub async fn record(
        &self,
        conn: &mut (impl Exec + ?Sized),
        entries: &[HistoryEntry<'_>],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let now = self.now(&mut *conn).await?;
        conn.execute(
            &self.queries.record_many,
            vec![now.into(), HistoryEntry::batch_json(entries).into()],
        )
        .await?;
        Ok(())
    }

    /// Writes the store-time shift of tests ([`outbox_core::StoreTime::Shifted`])
    /// on `conn`; nothing on the database clock.
    pub async fn sync_clock_on(&self, conn: &mut (impl Exec + ?Sized)) -> Result<(), StoreError> {
        if let Some(shift) = self.config.shift_micros() {
            conn.execute(&self.queries.sync_clock, vec![shift.into(), shift.into()])
                .await?;
        }
        Ok(())
    }

    /// Claims `(consumer, event_id)` in the inbox on `conn` (inside the
    /// consumer's transaction). `true` means "apply the effect now". A
    /// duplicate is a plain insert failing on the primary key: MySQL undoes
    /// just that statement, and (unlike `INSERT IGNORE`) no other error is
    /// turned into a warning.
    pub async fn inbox_claim(
        &self,
        conn: &mut (impl Exec + ?Sized),
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        let now = self.now(&mut *conn).await?;
        conn.insert_unique(
            &self.queries.inbox_claim,
            vec![consumer.into(), event_id.to_string().into(), now.into()],
        )
        .await
    }
}

impl<D: Driver> Protocol<D> {
    /// The store over `driver`, on `config`'s tables.
    pub fn new(driver: D, config: StoreConfig) -> Self {
        Self {
            driver,
            statements: Statements::new(config),
        }
    }

    /// Tests shift store time ([`outbox_core::StoreTime::Shifted`]): the
    /// shift is kept in the database, so every handle agrees.
    pub async fn sync_clock(&self) -> Result<(), StoreError> {
        if self.config.shift_micros().is_some() {
            let mut conn = self.driver.connect().await?;
            self.sync_clock_on(&mut conn).await?;
        }
        Ok(())
    }

    /// A transaction for the relay's own statements, at READ COMMITTED.
    pub async fn begin_relay(&self) -> Result<D::Tx, StoreError> {
        self.driver.begin(true).await
    }

    /// Creates the tables if missing. Idempotent; reports the schema
    /// version found and left. Tables of another schema version are refused
    /// with [`StoreError::Config`] naming the upgrade notes.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        let mut conn = self.driver.connect().await?;
        self.migrate_on(&mut conn).await
    }

    /// The schema version of the outbox tables: `None` if there are none,
    /// 1 for tables made before the version record existed.
    pub async fn schema_version(&self) -> Result<Option<i32>, StoreError> {
        let mut conn = self.driver.connect().await?;
        self.installed_version(&mut conn).await
    }

    /// Enqueues in a transaction of its own.
    pub async fn enqueue_alone(
        &self,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        self.sync_clock().await?;
        let mut tx = self.driver.begin(false).await?;
        let outcomes = self.enqueue(&mut tx, events).await?;
        D::commit(tx)
            .await
            .map_err(|e| e.during("enqueue", self.events()))?;
        Ok(outcomes)
    }

    /// Locks the rows of `leases` and returns those the lease still holds
    /// (token matches, in flight).
    async fn lock_leased(
        &self,
        tx: &mut D::Tx,
        leases: &[&Lease],
    ) -> Result<Vec<Held>, StoreError> {
        let tokens: HashMap<i64, i64> = leases
            .iter()
            .map(|l| (l.sequence, l.fencing_token.0))
            .collect();
        let sequences: Vec<i64> = tokens.keys().copied().collect();
        let query = with_in_list(&self.queries.lock_leased, sequences.len());
        let mut held = Vec::new();
        for r in tx.fetch(&query, params(&sequences)).await? {
            let sequence = r.int("sequence")?;
            let token = r.int("fencing_token")?;
            let status = r.int("status")?;
            if status == i64::from(codes::IN_FLIGHT) && tokens.get(&sequence) == Some(&token) {
                held.push(Held {
                    sequence,
                    event_id: r.event_id("event_id")?,
                    owner: r.text("lease_owner")?,
                    attempts: r.int("attempts")?,
                    lease_id: r.int("lease_id")?,
                    suspect_span: suspect_span(r.bool("suspect")?, r.int("suspect_span")?),
                });
            }
        }
        Ok(held)
    }

    /// Leases the next batch (see [`outbox_core::OutboxStore::claim_batch`]).
    pub async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        during("claim_batch", || self.events(), async move {
            self.sync_clock().await?;
            let mut tx = self.begin_relay().await?;
            // One claimer at a time: concurrent claims could split a key's prefix.
            let turn = tx.fetch(&self.queries.claim_lock, Vec::new()).await?;
            let flight_from = match turn.first() {
                Some(row) => row.int("flight_from")?,
                None => 0,
            };
            let now = self.now(&mut tx).await?;
            let expires = now.saturating_add(micros(request.lease_duration));
            let keys_in_flight = self.reap(&mut tx, now, flight_from).await?;
            let block = request.poison == PoisonPolicy::Block;
            let crash_looped = self.fail_crash_loops(&mut tx, request, now).await?;

            let ordered = request.ordering == Ordering::PerKey;
            // Keys in flight beyond the statement's list are left out below.
            let listed = keys_in_flight.len().min(MAX_LISTED_KEYS);
            let query = if ordered {
                Cow::Owned(with_keys_in_flight(
                    &self.queries.claim_candidates_per_key,
                    listed,
                ))
            } else {
                Cow::Borrowed(self.queries.claim_candidates_unordered.as_str())
            };
            let mut bound = vec![now.into()];
            if ordered {
                bound.extend(
                    keys_in_flight
                        .iter()
                        .take(listed)
                        .map(|k| Param::from(k.as_str())),
                );
                bound.extend([now.into(), now.into()]);
            }
            bound.push(limit(request.limit));
            let candidates: Vec<(i64, String, Option<u32>)> = tx
                .fetch(&query, bound)
                .await?
                .iter()
                .map(|r| {
                    Ok((
                        r.int("sequence")?,
                        r.text("partition_key")?,
                        suspect_span(r.bool("suspect")?, r.int("suspect_span")?),
                    ))
                })
                .collect::<Result<_, StoreError>>()?;
            let sequences: Vec<i64> = candidates.iter().map(|(s, _, _)| *s).collect();
            let locked = self.lock_claimable(&mut tx, &sequences, now).await?;
            // A row skipped as locked (a settlement in progress), a crash
            // suspect beyond the lease's allowance, or a row that does not
            // decode under Block ends its key's prefix: nothing after it may
            // be leased in this batch.
            let rows = self.read_rows(&mut tx, &locked).await?;
            let mut stopped: HashSet<&str> = keys_in_flight
                .iter()
                .skip(listed)
                .map(String::as_str)
                .collect();
            let mut suspects = SuspectAllowance::default();
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
                if let Some(span) = suspect {
                    if !suspects.admit(*span) {
                        stopped.insert(key);
                        continue;
                    }
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
                let head = [
                    new_lease_id().into(),
                    request.owner.as_str().into(),
                    expires.into(),
                ];
                tx.execute(&lease, with(head, &chosen)).await?;
                let lease_expires_at = from_micros(expires)?;
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
            // The next claim's reaping read starts at the first row still
            // in flight (this claim's leases included).
            let leased_from = chosen.iter().copied().min().unwrap_or(i64::MAX);
            let floor = tx
                .fetch(
                    &self.queries.flight_floor,
                    vec![flight_from.min(leased_from).into()],
                )
                .await?
                .first()
                .map(|row| row.opt_int("floor"))
                .transpose()?
                .flatten()
                .unwrap_or(flight_from);
            if floor != flight_from {
                tx.execute(&self.queries.move_flight_floor, vec![floor.into()])
                    .await?;
            }
            D::commit(tx).await?;
            Ok(ClaimedBatch {
                events,
                crash_looped,
                unreadable,
            })
        })
        .await
    }

    /// Marks `leases` published where they still hold.
    pub async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        during("ack", || self.events(), async move {
            if leases.is_empty() {
                return Ok(SettleReport::default());
            }
            self.sync_clock().await?;
            let mut tx = self.begin_relay().await?;
            let report = self.ack_in(&mut tx, leases).await?;
            D::commit(tx).await?;
            Ok(report)
        })
        .await
    }

    /// Acks `leases` in `tx` (a relay transaction; tests hold one open).
    pub async fn ack_in(
        &self,
        tx: &mut D::Tx,
        leases: &[Lease],
    ) -> Result<SettleReport, StoreError> {
        let held = self
            .lock_leased(tx, &leases.iter().collect::<Vec<_>>())
            .await?;
        let sequences: Vec<i64> = held.iter().map(|h| h.sequence).collect();
        if !sequences.is_empty() {
            let ack = with_in_list(&self.queries.ack, sequences.len());
            let now = self.now(&mut *tx).await?;
            tx.execute(&ack, with([now.into()], &sequences)).await?;
            // A published replacement lifts the block of the event it superseded.
            if !tx
                .fetch(&self.queries.superseded_blocking, Vec::new())
                .await?
                .is_empty()
            {
                let ids: Vec<String> = held.iter().map(|h| h.event_id.to_string()).collect();
                let unblock = with_in_list(&self.queries.unblock_superseded, ids.len());
                tx.execute(&unblock, params(&ids)).await?;
            }
        }
        let settled = held.into_iter().map(|h| h.event_id).collect();
        Ok(report(leases.iter().map(|l| l.event_id), &settled))
    }

    /// Settles failed attempts where the leases still hold.
    pub async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        during("nack", || self.events(), async move {
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
                                Some(now.saturating_add(micros(*after))),
                            ),
                            NackAction::Fail { block_key, .. } => (codes::FAILED, *block_key, None),
                        };
                        json!({"s": h.sequence, "st": status, "b": blocks, "a": available})
                    })
                    .collect();
                let sequences: Vec<i64> = held.iter().map(|h| h.sequence).collect();
                let nack = with_in_list(&self.queries.nack, sequences.len());
                let batch = Json::Array(batch).to_string();
                tx.execute(&nack, with([batch.into()], &sequences)).await?;
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
            D::commit(tx).await?;
            let settled = held.into_iter().map(|h| h.event_id).collect();
            Ok(report(nacks.iter().map(|n| n.lease.event_id), &settled))
        })
        .await
    }

    /// Returns leased rows unpublished where the leases still hold.
    pub async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        during("release", || self.events(), async move {
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
                // Rows whose publishing had started are judged as after a crash.
                let judged: HashMap<i64, CrashVerdict> = blame(
                    &held
                        .iter()
                        .filter(|h| started[&h.sequence])
                        .map(|h| (h.sequence, h.lease_id, h.suspect_span))
                        .collect::<Vec<_>>(),
                )
                .into_iter()
                .map(|v| (v.sequence, v))
                .collect();
                let batch: Vec<_> = held
                    .iter()
                    .map(|h| {
                        let verdict = judged.get(&h.sequence);
                        json!([
                            h.sequence,
                            started[&h.sequence],
                            i64::from(verdict.is_some_and(|v| v.blamed)),
                            verdict.map_or(0, |v| v.suspect_span)
                        ])
                    })
                    .collect();
                let sequences: Vec<i64> = held.iter().map(|h| h.sequence).collect();
                let release = with_in_list(&self.queries.release, sequences.len());
                let batch = Json::Array(batch).to_string();
                tx.execute(&release, with([batch.into()], &sequences))
                    .await?;
            }
            D::commit(tx).await?;
            let settled = held.into_iter().map(|h| h.event_id).collect();
            Ok(report(releases.iter().map(|r| r.lease.event_id), &settled))
        })
        .await
    }

    /// Records that the relay is alive, with its clock's skew from the
    /// store's and the publisher outage it is paused for, if any.
    pub async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        during("heartbeat", || self.events(), async move {
            self.sync_clock().await?;
            let mut conn = self.driver.connect().await?;
            let now = self.now(&mut conn).await?;
            let skew_ms = (self.config.clock.now().timestamp_micros() - now) / 1000;
            let outage = beat.outage.as_ref();
            conn.execute(
                &self.queries.heartbeat,
                vec![
                    beat.relay.as_str().into(),
                    now.into(),
                    skew_ms.into(),
                    outage.map(|_| now).into(),
                    outage.map(|o| o.destination.clone()).into(),
                    outage.map(|o| o.reason.clone()).into(),
                ],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// Leases that expired with rows in flight: the rows go back to
    /// pending and the crash is blamed ([`outbox_core::store::crash_culprit`]).
    /// Returns the keys with a row still in flight, which a per-key claim
    /// leaves alone.
    async fn reap(
        &self,
        tx: &mut D::Tx,
        now: i64,
        flight_from: i64,
    ) -> Result<BTreeSet<String>, StoreError> {
        // Read without locking (a locking scan of the status index
        // deadlocks with settlements), then lock the expired rows by
        // primary key, skipping any a settlement holds right now.
        let (in_flight, keys): (Vec<InFlight>, Vec<String>) = tx
            .fetch(&self.queries.in_flight, vec![flight_from.into()])
            .await?
            .iter()
            .map(|r| {
                let row = InFlight {
                    sequence: r.int("sequence")?,
                    lease_id: r.int("lease_id")?,
                    owner: r.text("lease_owner")?,
                    expires_at: r.opt_int("lease_expires_at")?.unwrap_or(0),
                    unstarted: r.bool("lease_unstarted")?,
                    suspect_span: suspect_span(r.bool("suspect")?, r.int("suspect_span")?),
                };
                Ok((row, r.text("partition_key")?))
            })
            .collect::<Result<_, StoreError>>()?;
        let reaping = reap(&in_flight, now);
        let expired: Vec<i64> = reaping
            .blamed
            .iter()
            .map(|v| v.sequence)
            .chain(reaping.returned.iter().copied())
            .collect();
        if expired.is_empty() {
            return Ok(keys.into_iter().collect());
        }
        let lock = with_in_list(&self.queries.lock_expired, expired.len());
        let locked: HashSet<i64> = tx
            .fetch(&lock, with([now.into()], &expired))
            .await?
            .iter()
            .map(|r| r.int("sequence"))
            .collect::<Result<_, _>>()?;
        let blamed: Vec<CrashVerdict> = reaping
            .blamed
            .into_iter()
            .filter(|v| locked.contains(&v.sequence))
            .collect();
        if !blamed.is_empty() {
            let sequences: Vec<i64> = blamed.iter().map(|v| v.sequence).collect();
            let update = with_in_list(&self.queries.reap, sequences.len());
            let batch = Json::Array(
                blamed
                    .iter()
                    .map(|v| json!([v.sequence, i64::from(v.blamed), v.suspect_span]))
                    .collect(),
            )
            .to_string();
            tx.execute(&update, with([batch.into()], &sequences))
                .await?;
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
                tx.execute(&update, params(&rows)).await?;
            }
        }
        // Every locked expired row went back to pending; the rest stay in
        // flight (a settlement holds them right now).
        Ok(in_flight
            .iter()
            .zip(keys)
            .filter(|(row, _)| !locked.contains(&row.sequence))
            .map(|(_, key)| key)
            .collect())
    }

    /// Rows blamed for `crash_loop_limit` crashes, at the head of their key,
    /// end failed.
    async fn fail_crash_loops(
        &self,
        tx: &mut D::Tx,
        request: &ClaimRequest,
        now: i64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let looped: Vec<i64> = tx
            .fetch(
                &self.queries.crash_loop_candidates,
                vec![i64::from(request.crash_loop_limit).into(), now.into()],
            )
            .await?
            .iter()
            .map(|r| r.int("sequence"))
            .collect::<Result<_, _>>()?;
        let looped = self.lock_claimable(tx, &looped, now).await?;
        if looped.is_empty() {
            return Ok(Vec::new());
        }
        let fail = with_in_list(&self.queries.fail_rows, looped.len());
        let block = request.poison == PoisonPolicy::Block;
        tx.execute(&fail, with([block.into()], &looped)).await?;
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
        tx: &mut D::Tx,
        unreadable: &[UnreadableEvent],
        block: bool,
        actor: &str,
    ) -> Result<(), StoreError> {
        if unreadable.is_empty() {
            return Ok(());
        }
        let sequences: Vec<i64> = unreadable.iter().map(|u| u.event.sequence).collect();
        let fail = with_in_list(&self.queries.fail_rows, sequences.len());
        tx.execute(&fail, with([block.into()], &sequences)).await?;
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
        tx: &mut D::Tx,
        sequences: &[i64],
        now: i64,
    ) -> Result<Vec<i64>, StoreError> {
        if sequences.is_empty() {
            return Ok(Vec::new());
        }
        let lock = with_in_list(&self.queries.lock_rows, sequences.len());
        tx.fetch(&lock, with([now.into()], sequences))
            .await?
            .iter()
            .map(|r| r.int("sequence"))
            .collect()
    }

    /// The rows, each with its current fencing token, decoded one by one.
    async fn read_rows(
        &self,
        tx: &mut D::Tx,
        sequences: &[i64],
    ) -> Result<HashMap<i64, ReadRow>, StoreError> {
        if sequences.is_empty() {
            return Ok(HashMap::new());
        }
        let read = with_in_list(&self.queries.read_rows, sequences.len());
        tx.fetch(&read, params(sequences))
            .await?
            .iter()
            .map(|r| {
                let token = r.int("fencing_token")?;
                let raw = raw_event(r)?;
                Ok((raw.sequence, (token, raw.decode())))
            })
            .collect()
    }

    /// Deletes up to `batch_size` inbox claims older than `older_than`.
    pub async fn inbox_purge(
        &self,
        older_than: std::time::Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        self.sync_clock().await?;
        let mut conn = self.driver.connect().await?;
        let cutoff = self
            .now(&mut conn)
            .await?
            .saturating_sub(micros(older_than));
        conn.execute(
            &self.queries.inbox_purge,
            vec![cutoff.into(), limit(batch_size)],
        )
        .await
    }
}
