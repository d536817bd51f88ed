//! PostgreSQL: enqueue inside your Diesel transaction, on diesel-async's
//! [`AsyncPgConnection`] or (feature `postgres-sync`) Diesel's
//! `PgConnection`, migrate the tables, and run relays and inboxes over
//! diesel-async; the statements are `outbox-sql`'s, the same the sqlx
//! store runs.

mod admin;
mod inbox;
mod rows;
mod statements;
mod store;
mod sync;
#[cfg(feature = "testing")]
mod testing;

pub use crate::Effect;
pub use inbox::{PgInbox, PgInboxTx};
pub use store::PgStore;

use std::sync::Arc;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use outbox_core::store::EnqueueOutcome;
use outbox_core::{NewEvent, StoreError};
use outbox_sql::enqueue::{EnqueueColumns, outcomes};
use outbox_sql::postgres::Queries;
use outbox_sql::{Migrated, StoreConfig};

use crate::error::ResultExt;
use statements::{Applied, AppliedTable, Inserted, Installed, InstalledVersion};

/// A statement cancelled by `lock_timeout` (Diesel keeps the server's
/// message, not its SQLSTATE 55P03).
fn is_lock_timeout(error: &diesel::result::Error) -> bool {
    matches!(error, diesel::result::Error::DatabaseError(_, info)
        if info.message().contains("lock timeout"))
}

pub use outbox_sql::postgres::SCHEMA_VERSION;

/// The outbox tables as a Diesel migration (default names, created in the
/// connection's current schema), for applications that run their schema
/// through `diesel_migrations`:
/// `conn.run_pending_migrations(outbox_diesel::postgres::MIGRATIONS)`.
/// The same tables as [`PgOutbox::migrate`] with default names (a test
/// compares the catalogs); its `up.sql` is the default rendering of the
/// schema template.
pub const MIGRATIONS: diesel_migrations::EmbeddedMigrations =
    diesel_migrations::embed_migrations!("migrations");

/// The outbox tables as a Diesel application writes them: enqueue in the
/// transaction of the business write, and migrate.
///
/// Any relay over the same tables publishes what you enqueue here: the
/// sqlx store (`outbox_sqlx::postgres::PgStore` with `outbox_core::Relay`)
/// or the `outbox relay` daemon. The events are the same rows, written by
/// the same statement.
#[derive(Clone)]
pub struct PgOutbox {
    config: StoreConfig,
    queries: Arc<Queries>,
}

impl std::fmt::Debug for PgOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOutbox")
            .field("tables", &self.config.tables)
            .finish_non_exhaustive()
    }
}

impl PgOutbox {
    /// The outbox on `config`'s tables (names were validated when built).
    pub fn new(config: StoreConfig) -> Self {
        let queries = Arc::new(Queries::new(&config.tables));
        Self { config, queries }
    }

    /// The settings.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Enqueues `events` on `conn`, inside your transaction
    /// (`conn.transaction(async |conn| { … })`), in one
    /// statement. Each outcome says whether a row was written or the
    /// `event_id` already existed (a no-op). Invalid events are refused
    /// before anything is sent, so your transaction stays usable.
    pub async fn enqueue(
        &self,
        conn: &mut AsyncPgConnection,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        // Bad input is refused here, before anything is sent.
        let columns = EnqueueColumns::checked(events, &self.config, true)?;
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<Inserted> =
            diesel_async::RunQueryDsl::load(statements::enqueue(&self.queries, columns), conn)
                .await
                .store()
                .map_err(|e| e.during("enqueue", self.config.tables.events()))?;
        Ok(outcomes(events, rows.into_iter().map(Inserted::pair)))
    }

    /// The schema DDL and functions for these names and limits (what
    /// [`PgOutbox::migrate`] runs; the sqlx store's `schema_sql` is the
    /// same text).
    pub fn schema_sql(&self) -> String {
        outbox_sql::postgres::schema_sql(&self.config, &self.queries)
    }

    /// Creates or updates the tables, indexes, trigger and functions, in
    /// one transaction. Idempotent and quiet; concurrent callers take
    /// turns. On tables this version already made it does nothing (no DDL,
    /// no lock a producer could queue behind); DDL it has to run waits for
    /// each lock at most a second and is retried, so producers never queue
    /// behind it long. Tables of another schema version are refused before
    /// anything changes, naming the upgrade notes.
    pub async fn migrate(&self, conn: &mut AsyncPgConnection) -> Result<Migrated, StoreError> {
        use outbox_sql::postgres::{MIGRATE_ATTEMPTS, migrate_locks_unavailable, migrate_pause};
        for attempt in 1..=MIGRATE_ATTEMPTS {
            if let Some(migrated) = self.migrate_once(conn).await? {
                return Ok(migrated);
            }
            tokio::time::sleep(migrate_pause(attempt)).await;
        }
        Err(migrate_locks_unavailable().during("migrate", self.config.tables.events()))
    }

    /// One attempt of [`PgOutbox::migrate`]; `None` when a lock was not
    /// granted in time (rolled back).
    async fn migrate_once(
        &self,
        conn: &mut AsyncPgConnection,
    ) -> Result<Option<Migrated>, StoreError> {
        let schema = self.schema_sql();
        let fingerprint = outbox_sql::postgres::schema_fingerprint(&self.config, &self.queries);
        let migrated = conn
            .transaction::<_, crate::Error, _>(async |conn| {
                diesel_async::RunQueryDsl::execute(
                    diesel::sql_query(self.queries.migrate_lock.as_str()),
                    &mut *conn,
                )
                .await?;
                let installed: Installed = diesel_async::RunQueryDsl::get_result(
                    diesel::sql_query(self.queries.installed_tables.as_str()),
                    &mut *conn,
                )
                .await?;
                let version = if installed.both() {
                    diesel_async::RunQueryDsl::get_result::<InstalledVersion>(
                        diesel::sql_query(self.queries.installed_version.as_str()),
                        &mut *conn,
                    )
                    .await?
                    .version
                } else {
                    None
                };
                let migrated = self.check(&installed, version)?;
                let present = diesel_async::RunQueryDsl::get_result::<AppliedTable>(
                    diesel::sql_query(self.queries.applied_table.as_str()),
                    &mut *conn,
                )
                .await?
                .present;
                if present {
                    let applied = diesel_async::RunQueryDsl::get_result::<Applied>(
                        diesel::sql_query(self.queries.applied_fingerprint.as_str()),
                        &mut *conn,
                    )
                    .await?;
                    if applied.fingerprint.as_deref() == Some(fingerprint.as_str()) {
                        return Ok(Some(migrated));
                    }
                }
                diesel_async::RunQueryDsl::execute(
                    diesel::sql_query(outbox_sql::postgres::migrate_lock_timeout()),
                    &mut *conn,
                )
                .await?;
                conn.batch_execute(&schema).await?;
                Ok(Some(migrated))
            })
            .await;
        match migrated {
            Err(crate::Error::Diesel(e)) if is_lock_timeout(&e) => Ok(None),
            other => other.map_err(|e| {
                e.into_store_error()
                    .during("migrate", self.config.tables.events())
            }),
        }
    }

    fn check(&self, installed: &Installed, version: Option<i32>) -> Result<Migrated, StoreError> {
        let found = outbox_sql::config::installed_version(
            installed.events.is_some(),
            installed.record.is_some(),
            version,
        );
        outbox_sql::config::check_schema_version(
            &self.config.tables.events(),
            found,
            SCHEMA_VERSION,
        )
    }
}
