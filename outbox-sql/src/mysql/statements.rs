//! The MySQL/MariaDB store's statements on a connection the caller holds:
//! enqueue (in the caller's transaction), migrate, the schema version, the
//! clock and an inbox claim. The store over a pool is
//! [`Protocol`](super::Protocol).

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use outbox_core::store::EnqueueOutcome;
use outbox_core::{EventId, NewEvent, RawEvent, StoreError};
use serde_json::Value as Json;

use super::driver::{Exec, Param, Row};
use super::{Queries, SCHEMA_VERSION};
use crate::config::{Migrated, StoreConfig};
use crate::error::during;
use crate::validate::headers_json;

/// The settings and statements: what runs on a connection the caller
/// holds (enqueue, an inbox claim, migrate), with no pool of its own.
#[derive(Clone)]
pub struct Statements {
    /// The settings.
    pub config: StoreConfig,
    /// The statements for the settings' names.
    pub queries: Arc<Queries>,
    /// Claims made through this store (and its clones): every
    /// [`FORGET_OWNERS_EVERY`]th removes the owners of finished leases.
    pub(super) claims: Arc<std::sync::atomic::AtomicU64>,
}

/// How often (in claims of one store) a claim removes the owner records
/// of leases with nothing left in flight: one statement saved on the
/// other claims, a few dozen rows kept meanwhile.
pub const FORGET_OWNERS_EVERY: u64 = 16;

/// Each value as a parameter.
pub(super) fn params<T: Clone + Into<Param>>(values: &[T]) -> Vec<Param> {
    values.iter().cloned().map(Into::into).collect()
}

/// `head` then each of `values`.
pub(super) fn with<T: Clone + Into<Param>>(
    head: impl IntoIterator<Item = Param>,
    values: &[T],
) -> Vec<Param> {
    head.into_iter().chain(params(values)).collect()
}

pub(super) use crate::param::{limit, micros};

/// The columns of [`super::EVENT_COLUMNS`], not yet trusted as an event
/// (see [`Row::raw_event`]).
pub fn raw_event(row: &mut Row) -> Result<RawEvent, StoreError> {
    row.raw_event(false)
}

/// Event ids as a JSON array of strings, for the statements that join
/// them with `JSON_TABLE`.
pub(super) fn id_array(ids: impl Iterator<Item = EventId>) -> String {
    Json::Array(ids.map(|id| Json::String(id.to_string())).collect()).to_string()
}

impl Statements {
    /// The statements for `config`'s tables.
    pub fn new(config: StoreConfig) -> Self {
        let queries = Arc::new(Queries::new(&config.tables));
        Self {
            config,
            queries,
            claims: Arc::default(),
        }
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
    pub(super) fn located(name: &str) -> Vec<Param> {
        match name.split_once('.') {
            Some((d, t)) => vec![d.into(), t.into()],
            None => vec![Param::Null, name.into()],
        }
    }

    pub(super) async fn count(
        conn: &mut (impl Exec + ?Sized),
        sql: &str,
        params: Vec<Param>,
    ) -> Result<i64, StoreError> {
        let rows = conn.fetch(sql, params).await?;
        rows.first().map_or(Ok(0), |r| r.int("n"))
    }

    /// Creates the tables if missing on `conn` (outside any transaction:
    /// MySQL commits DDL at once). See [`Protocol::migrate`](super::Protocol::migrate).
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
            self.align_columns(&mut *conn).await?;
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

    /// Adds [`super::ADDED_COLUMNS`] an older table lacks and sets
    /// [`super::CHANGED_DEFAULTS`] where it has another default. `INSTANT`:
    /// metadata only, no rebuild, no lock a producer waits behind; nothing
    /// is done where the table matches, so a deploy's `migrate()` alters
    /// nothing.
    pub(super) async fn align_columns(
        &self,
        conn: &mut (impl Exec + ?Sized),
    ) -> Result<(), StoreError> {
        for (suffix, column, definition) in super::ADDED_COLUMNS {
            if self.column_default(conn, suffix, column).await?.is_none() {
                let change = format!("ADD COLUMN {column} {definition}");
                self.alter_instantly(conn, suffix, &change).await?;
            }
        }
        for (suffix, column, default) in super::CHANGED_DEFAULTS {
            if let Some(present) = self.column_default(conn, suffix, column).await?
                && present.as_deref() != Some(*default)
            {
                let change = format!("ALTER COLUMN {column} SET DEFAULT {default}");
                self.alter_instantly(conn, suffix, &change).await?;
            }
        }
        Ok(())
    }

    /// `column` of the table `suffix` as `information_schema` lists it:
    /// `None` if the table has no such column, else its default.
    async fn column_default(
        &self,
        conn: &mut (impl Exec + ?Sized),
        suffix: &str,
        column: &str,
    ) -> Result<Option<Option<String>>, StoreError> {
        let mut located = Self::located(&self.config.tables.table(suffix));
        located.push(column.into());
        let rows = conn
            .fetch(
                "SELECT COLUMN_DEFAULT AS present FROM information_schema.columns
                 WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? AND column_name = ?",
                located,
            )
            .await?;
        rows.first().map(|r| r.opt_text("present")).transpose()
    }

    async fn alter_instantly(
        &self,
        conn: &mut (impl Exec + ?Sized),
        suffix: &str,
        change: &str,
    ) -> Result<(), StoreError> {
        let table = self.config.tables.table(suffix);
        conn.execute(
            &format!("ALTER TABLE {table} {change}, ALGORITHM = INSTANT"),
            Vec::new(),
        )
        .await?;
        Ok(())
    }

    /// Brings the events table's secondary indexes to the template's
    /// definitions ([`super::event_indexes`]): `CREATE TABLE IF NOT EXISTS`
    /// leaves tables made by an earlier release of schema version 2 as they
    /// were (MySQL has no `CREATE INDEX IF NOT EXISTS`). A missing index is
    /// added and one with other columns rebuilt, online (`LOCK = NONE`:
    /// writes go on while it builds); nothing is done when they match.
    pub(super) async fn align_indexes(
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

    statements_enqueue!(
        "Enqueues `events` on `conn`, typically the business transaction. Locks the events' partition keys until that transaction ends. Invalid events are refused before anything is sent, so the transaction stays usable.",
        checked by false
    );

    /// Inserts valid `events` and locks their partition keys until the
    /// caller's transaction ends.
    pub(crate) async fn enqueue_now(
        &self,
        conn: &mut (impl Exec + ?Sized),
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
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
        let mut ours = Vec::with_capacity(fresh.len());
        for r in conn
            .fetch(&self.queries.read_back, vec![ids.into()])
            .await?
        {
            if r.int("enqueue_mark")? == mark {
                ours.push((*r.event_id("event_id")?.as_uuid(), r.int("sequence")?));
            }
        }
        Ok(crate::enqueue::outcomes(events, ours))
    }

    record_history!();

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
