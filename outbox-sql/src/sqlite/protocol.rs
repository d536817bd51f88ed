//! [`Protocol`]: the SQLite store over any [`Driver`] — its settings, the
//! schema, store time, the enqueue, the attempt history and the inbox. The
//! relay's side is in `relay.rs`, the operator's in `admin.rs`.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::store::{EnqueueOutcome, SettleReport};
use outbox_core::{EventId, NewEvent, StoreError};
use serde_json::json;

use super::{Driver, Exec, Queries, SCHEMA_VERSION};
use crate::config::{Migrated, StoreConfig};
use crate::error::during;
use crate::param::{limit, micros};
use crate::settle::report_by_ids;
use crate::validate::headers_json;

/// The settings and the statements for their table names.
#[derive(Clone)]
pub struct Statements {
    /// The settings.
    pub config: StoreConfig,
    /// The statements for the settings' names.
    pub queries: Arc<Queries>,
    /// Claims made through this store (and its clones): every
    /// [`HEAL_SET_ASIDE_EVERY`](crate::codes::HEAL_SET_ASIDE_EVERY)th sets
    /// back rows set aside whose block or wait ended by other means.
    pub(super) claims: Arc<std::sync::atomic::AtomicU64>,
}

dialect_protocol!();

impl Statements {
    /// The events table's name, for errors.
    pub fn events(&self) -> String {
        self.config.tables.events()
    }

    /// Store time: this host's clock (plus the shift tests set), in
    /// microseconds since the epoch.
    pub async fn now(&self, conn: &mut (impl Exec + ?Sized)) -> Result<i64, StoreError> {
        let rows = conn.fetch(&self.queries.now, Vec::new()).await?;
        let first = rows
            .first()
            .ok_or_else(|| StoreError::fatal("store time: no row"))?;
        first.int("now")
    }

    statements_enqueue!(
        "Enqueues `events` on `conn` (the caller's transaction), in one statement. Invalid events are refused before anything is sent.",
        checked by false
    );

    /// Inserts valid `events` in one statement, at store time read in the
    /// caller's transaction.
    pub(crate) async fn enqueue_now(
        &self,
        conn: &mut (impl Exec + ?Sized),
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        // No clock sync here: it would write, and the caller's
        // transaction holds SQLite's one write lock.
        let now = self.now(conn).await?;
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
        let params = vec![
            serde_json::Value::Array(batch).to_string().into(),
            now.into(),
        ];
        let rows = conn.fetch(&self.queries.enqueue, params).await?;
        crate::enqueue::outcomes_of_rows(events, &rows)
    }

    record_history!();

    /// Claims an event for `consumer` on `conn` (the consumer's
    /// transaction): `false` if it was claimed before.
    pub async fn inbox_claim(
        &self,
        conn: &mut (impl Exec + ?Sized),
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        let now = self.now(conn).await?;
        let params = vec![consumer.into(), event_id.to_string().into(), now.into()];
        Ok(conn.execute(&self.queries.inbox_claim, params).await? == 1)
    }

    async fn installed_version(
        &self,
        conn: &mut (impl Exec + ?Sized),
    ) -> Result<Option<i32>, StoreError> {
        let tables = &self.config.tables;
        let present = "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = ?1";
        let events = conn.fetch(present, vec![tables.events().into()]).await?;
        let record_table = tables.table("schema_version");
        let record = conn
            .fetch(present, vec![record_table.clone().into()])
            .await?;
        let (events, record) = (count(&events)? > 0, count(&record)? > 0);
        let version = if events && record {
            let sql = format!("SELECT MAX(version) AS n FROM {record_table}");
            let rows = conn.fetch(&sql, Vec::new()).await?;
            rows.first()
                .map(|r| r.opt_int("n"))
                .transpose()?
                .flatten()
                .map(|v| v as i32)
        } else {
            None
        };
        Ok(crate::config::installed_version(events, record, version))
    }
}

/// The `n` of a one-row query (`COUNT(*) AS n`, a setting `AS n`).
fn count(rows: &[super::Row]) -> Result<i64, StoreError> {
    rows.first()
        .ok_or_else(|| StoreError::fatal("a count returned no row"))?
        .int("n")
}

impl<D: Driver> Protocol<D> {
    /// The store over `driver`'s pool on `config`'s tables. Refuses a
    /// schema in the table names (SQLite has none; use a prefix).
    pub fn new(driver: D, config: StoreConfig) -> Result<Self, StoreError> {
        if config.tables.schema().is_some() {
            return Err(StoreError::Config(
                "SQLite tables take a prefix, not a schema".into(),
            ));
        }
        let queries = Arc::new(Queries::new(&config.tables));
        Ok(Self {
            driver,
            statements: Statements {
                config,
                queries,
                claims: Arc::default(),
            },
        })
    }

    /// The schema DDL for these table names (what [`Protocol::migrate`] runs).
    pub fn schema_sql(&self) -> String {
        super::schema_sql(&self.config.tables)
    }

    /// Creates the tables and indexes if missing, and adds the columns
    /// added since (`ADDED_COLUMNS`). Idempotent; reports the schema
    /// version found and left. Tables of another schema version are
    /// refused with [`StoreError::Config`] naming the upgrade notes.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        during("migrate", || self.events(), async move {
            let schema = self.schema_sql();
            let mut tx = self.driver.begin().await?;
            let found = self.installed_version(&mut tx).await?;
            let migrated = crate::config::check_schema_version(
                &self.config.tables.events(),
                found,
                SCHEMA_VERSION,
            )?;
            tx.run_script(&schema).await?;
            for (suffix, column, definition) in super::ADDED_COLUMNS {
                let table = self.config.tables.table(suffix);
                let present = tx
                    .fetch(
                        "SELECT COUNT(*) AS n FROM pragma_table_info(?1) WHERE name = ?2",
                        vec![table.clone().into(), (*column).into()],
                    )
                    .await?;
                if count(&present)? == 0 {
                    let alter = format!("ALTER TABLE {table} ADD COLUMN {column} {definition}");
                    tx.execute(&alter, Vec::new()).await?;
                }
            }
            D::commit(tx).await?;
            Ok(migrated)
        })
        .await
    }

    /// The schema version of the outbox tables: `None` if there are none,
    /// 1 for tables made before the version record existed.
    pub async fn schema_version(&self) -> Result<Option<i32>, StoreError> {
        let mut conn = self.driver.connect().await?;
        self.installed_version(&mut conn).await
    }

    /// Tests shift store time ([`outbox_core::StoreTime::Shifted`]): the
    /// shift is kept in the database, so every handle agrees.
    pub async fn sync_clock(&self) -> Result<(), StoreError> {
        if let Some(shift) = self.config.shift_micros() {
            let current = format!(
                "SELECT clock_shift_us AS n FROM {} WHERE id = 1",
                self.config.tables.table("control")
            );
            let rows = self
                .driver
                .connect()
                .await?
                .fetch(&current, Vec::new())
                .await?;
            if count(&rows)? != shift {
                let mut tx = self.driver.begin().await?;
                tx.execute(&self.queries.sync_clock, vec![shift.into()])
                    .await?;
                D::commit(tx).await?;
            }
        }
        Ok(())
    }

    /// A transaction as a producer's.
    pub async fn begin_producer(&self) -> Result<D::Tx, StoreError> {
        self.driver.begin().await
    }

    /// Runs a settlement `query` on a JSON `batch` (with store time as its
    /// second parameter if `with_now`) in a transaction of its own; the
    /// events of `asked` whose ids it did not return were fenced.
    pub(super) async fn settle_json(
        &self,
        query: &str,
        batch: serde_json::Value,
        with_now: bool,
        asked: impl Iterator<Item = EventId>,
    ) -> Result<SettleReport, StoreError> {
        let mut tx = self.driver.begin().await?;
        let mut params = vec![batch.to_string().into()];
        if with_now {
            params.push(self.now(&mut tx).await?.into());
        }
        let rows = tx.fetch(query, params).await?;
        D::commit(tx).await?;
        Ok(report_by_ids(asked, &super::relay::settled_ids(&rows)?))
    }

    /// The inbox purge's own work (`inbox_purge` wraps it): up to `most`
    /// claims older than `age`.
    pub(crate) async fn inbox_gc(&self, age: Duration, most: usize) -> Result<u64, StoreError> {
        let mut tx = self.driver.begin().await?;
        let cutoff = self.now(&mut tx).await?.saturating_sub(micros(age));
        let params = vec![cutoff.into(), limit(most)];
        let done = tx.execute(&self.queries.inbox_purge, params).await?;
        D::commit(tx).await?;
        Ok(done)
    }
}
