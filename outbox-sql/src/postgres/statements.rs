//! The PostgreSQL statements that run on a connection the caller holds
//! (enqueue in the business transaction, an inbox claim, migrate), and
//! what their rows mean.

use std::sync::Arc;

use outbox_core::store::EnqueueOutcome;
use outbox_core::{EventId, NewEvent, RawEvent, StoreError};

use super::driver::{Exec, Param, Row, texts};
use super::{Queries, SCHEMA_VERSION, migrate_lock_timeout, schema_fingerprint, schema_sql};
use crate::config::{Migrated, StoreConfig};
use crate::enqueue::EnqueueColumns;
use crate::settle::ClaimRow;
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

pub(super) fn millis(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn limit(n: usize) -> Param {
    Param::BigInt(n.min(i64::MAX as usize) as i64)
}

/// The columns of [`super::EVENT_COLUMNS`], not yet trusted as an event
/// (see [`Row::raw_event`]).
pub fn raw_event(row: &mut Row) -> Result<RawEvent, StoreError> {
    row.raw_event(false)
}

/// A claim's row: the event and its lease (see [`Exec::fetch_claimed`]).
pub fn claim_row(row: &mut Row) -> Result<ClaimRow, StoreError> {
    Ok(ClaimRow {
        raw: raw_event(row)?,
        crash_looped: row.bool("crash_looped")?,
        fencing_token: row.opt_int("fencing_token")?,
        lease_expires_at: row.opt_time("lease_expires_at")?,
    })
}

impl Statements {
    /// The statements for `config`'s names (validated when it was built).
    pub fn new(config: StoreConfig) -> Self {
        let queries = Arc::new(Queries::new(&config.tables));
        Self { config, queries }
    }

    /// The events table's name, for errors.
    pub fn events(&self) -> String {
        self.config.tables.events()
    }

    /// The schema DDL and functions for these names and limits (what
    /// `migrate` runs).
    pub fn schema_sql(&self) -> String {
        schema_sql(&self.config, &self.queries)
    }

    statements_enqueue!(
        "Enqueues `events` on `conn` (the caller's transaction) in one statement. Invalid events are refused before anything is sent, so the caller's transaction stays usable."
    );

    /// Checks `events` while it lays them out as columns, and inserts them
    /// in one statement.
    pub(crate) async fn enqueue_now(
        &self,
        conn: &mut (impl Exec + ?Sized),
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        if let [event] = events {
            check_event(event, &self.config.limits, true)?;
            let params = vec![
                Param::Uuid(*event.event_id.as_uuid()),
                Param::Text(event.aggregate_type.clone()),
                Param::Text(event.aggregate_id.clone()),
                Param::Text(event.event_type.clone()),
                Param::Text(event.partition_key.clone()),
                Param::Text(event.payload.as_str().to_owned()),
                Param::Int(event.payload_version as i32),
                Param::Text(headers_json(event)),
                Param::OptBigInt(self.config.delay_ms(event.available_at)),
            ];
            let rows = conn.fetch(&self.queries.enqueue_one, params).await?;
            return crate::enqueue::outcomes_of_rows(events, &rows);
        }
        let columns = EnqueueColumns::checked(events, &self.config, true)?;
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let params = vec![
            Param::Uuids(columns.event_ids),
            texts(columns.aggregate_types),
            texts(columns.aggregate_ids),
            texts(columns.event_types),
            texts(columns.partition_keys),
            texts(columns.payloads),
            Param::Ints(columns.payload_versions),
            Param::Texts(columns.headers),
            Param::OptBigInts(columns.delays_ms),
        ];
        let rows = conn.fetch(&self.queries.enqueue, params).await?;
        crate::enqueue::outcomes_of_rows(events, &rows)
    }

    /// The schema version of the outbox tables: `None` if there are none,
    /// 1 for tables made before the version record existed.
    pub async fn installed_version(
        &self,
        conn: &mut (impl Exec + ?Sized),
    ) -> Result<Option<i32>, StoreError> {
        let tables = conn.fetch(&self.queries.installed_tables, vec![]).await?;
        let tables = tables
            .first()
            .ok_or_else(|| StoreError::fatal("no row from the installed-tables query"))?;
        let events = tables.opt_text("events")?.is_some();
        let record = tables.opt_text("record")?.is_some();
        let version = if events && record {
            let rows = conn.fetch(&self.queries.installed_version, vec![]).await?;
            match rows.first() {
                Some(row) => row.opt_int("version")?.map(|v| v as i32),
                None => None,
            }
        } else {
            None
        };
        Ok(crate::config::installed_version(events, record, version))
    }

    /// One attempt of `migrate` inside the caller's transaction on `tx`:
    /// nothing to do on tables that recorded this schema's fingerprint (no
    /// DDL, no lock but the migrations' own advisory one); otherwise the
    /// DDL, each lock waited for at most `MIGRATE_LOCK_TIMEOUT_MS` so
    /// producers never queue behind it long. `None` when a lock was not
    /// granted in time: the caller rolls back and tries again.
    pub async fn migrate_in(
        &self,
        tx: &mut (impl Exec + ?Sized),
    ) -> Result<Option<Migrated>, StoreError> {
        tx.execute(&self.queries.migrate_lock, vec![]).await?;
        let found = self.installed_version(tx).await?;
        let migrated = crate::config::check_schema_version(&self.events(), found, SCHEMA_VERSION)?;
        let fingerprint = schema_fingerprint(&self.config, &self.queries);
        let present = tx.fetch(&self.queries.applied_table, vec![]).await?;
        if present.first().map(|r| r.bool("present")).transpose()? == Some(true) {
            let applied = tx.fetch(&self.queries.applied_fingerprint, vec![]).await?;
            let applied = applied
                .first()
                .map(|r| r.opt_text("fingerprint"))
                .transpose()?
                .flatten();
            if applied.as_deref() == Some(fingerprint.as_str()) {
                return Ok(Some(migrated));
            }
        }
        tx.execute(&migrate_lock_timeout(), vec![]).await?;
        if !tx.run_script(&self.schema_sql()).await? {
            return Ok(None);
        }
        Ok(Some(migrated))
    }

    /// Tests shift store time ([`outbox_core::StoreTime::Shifted`]): the
    /// shift is kept in the database, so every handle agrees.
    pub async fn sync_clock_on(&self, conn: &mut (impl Exec + ?Sized)) -> Result<(), StoreError> {
        if let Some(shift) = self.config.shift_micros() {
            conn.execute(&self.queries.sync_clock, vec![Param::BigInt(shift)])
                .await?;
        }
        Ok(())
    }

    /// Claims `(consumer, event_id)` in the inbox on `conn`, inside the
    /// caller's transaction: `true` means "apply the effect now". A
    /// concurrent claim of the same pair waits on the primary key until
    /// the first commits, then finds the row and inserts nothing.
    pub async fn inbox_claim(
        &self,
        conn: &mut (impl Exec + ?Sized),
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        let inserted = conn
            .execute(
                &self.queries.inbox_claim,
                vec![consumer.into(), event_id.into()],
            )
            .await?;
        Ok(inserted == 1)
    }
}
