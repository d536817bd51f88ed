//! PostgreSQL: enqueue inside your Diesel transaction, on diesel-async's
//! [`AsyncPgConnection`] or (feature `postgres-sync`) Diesel's
//! `PgConnection`, migrate the tables, and run relays and inboxes over
//! diesel-async; the statements are `outbox-sql`'s, the same the sqlx
//! store runs.

mod driver;
mod inbox;
mod statements;
mod store;
mod sync;
#[cfg(feature = "testing")]
mod testing;

pub use crate::Effect;
pub use inbox::{PgInbox, PgInboxTx};
pub use store::PgStore;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use outbox_core::StoreError;
use outbox_sql::Migrated;
use outbox_sql::postgres::Statements;

use driver::{Diesel, is_lock_timeout};

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

diesel_outbox! {
    /// The outbox tables as a Diesel application writes them: enqueue in the
    /// transaction of the business write, and migrate.
    ///
    /// Any relay over the same tables publishes what you enqueue here: the
    /// sqlx store (`outbox_sqlx::postgres::PgStore` with `outbox_core::Relay`)
    /// or the `outbox relay` daemon. The events are the same rows, written by
    /// the same statement.
    PgOutbox(AsyncPgConnection, Statements);
    /// Enqueues `events` on `conn`, inside your transaction
    /// (`conn.transaction(async |conn| { … })`), in one
    /// statement. Each outcome says whether a row was written or the
    /// `event_id` already existed (a no-op). Invalid events are refused
    /// before anything is sent, so your transaction stays usable.
    enqueue
}

impl PgOutbox {
    /// The schema DDL and functions for these names and limits (what
    /// [`PgOutbox::migrate`] runs; the sqlx store's `schema_sql` is the
    /// same text).
    pub fn schema_sql(&self) -> String {
        self.statements.schema_sql()
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
        Err(migrate_locks_unavailable().during("migrate", self.config().tables.events()))
    }

    /// One attempt of [`PgOutbox::migrate`] in a Diesel transaction (a
    /// savepoint inside one of yours); `None` when a lock was not granted
    /// in time (rolled back).
    async fn migrate_once(
        &self,
        conn: &mut AsyncPgConnection,
    ) -> Result<Option<Migrated>, StoreError> {
        let migrated = conn
            .transaction::<_, crate::Error, _>(async |conn| {
                match self.statements.migrate_in(&mut Diesel(conn)).await? {
                    Some(migrated) => Ok(migrated),
                    // Rolls the attempt back.
                    None => Err(diesel::result::Error::RollbackTransaction.into()),
                }
            })
            .await;
        match migrated {
            Ok(migrated) => Ok(Some(migrated)),
            Err(crate::Error::Diesel(diesel::result::Error::RollbackTransaction)) => Ok(None),
            Err(e) => Err(e
                .into_store_error()
                .during("migrate", self.config().tables.events())),
        }
    }

    fn check(
        &self,
        installed: &statements::Installed,
        version: Option<i32>,
    ) -> Result<Migrated, StoreError> {
        let found = outbox_sql::config::installed_version(
            installed.events.is_some(),
            installed.record.is_some(),
            version,
        );
        outbox_sql::config::check_schema_version(
            &self.config().tables.events(),
            found,
            SCHEMA_VERSION,
        )
    }
}
