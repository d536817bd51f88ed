//! MySQL 8 / MariaDB ≥ 10.6: enqueue inside your Diesel transaction, on
//! diesel-async's [`AsyncMysqlConnection`] or (feature `mysql-sync`)
//! Diesel's `MysqlConnection`,
//! migrate the tables, and run relays and inboxes over diesel-async. The
//! protocol (every statement, in which order, what a row means) is
//! `outbox-sql`'s, the one the sqlx store runs: this module binds
//! parameters and reads rows.

mod driver;
mod inbox;
mod store;
mod sync;
#[cfg(feature = "testing")]
mod testing;

pub use inbox::{MysqlInbox, MysqlInboxTx};
pub use store::MysqlStore;

use diesel_async::AsyncMysqlConnection;
use outbox_core::StoreError;
use outbox_sql::Migrated;
use outbox_sql::mysql::Statements;

use driver::Diesel;

pub use outbox_sql::mysql::SCHEMA_VERSION;

/// The outbox tables as a Diesel migration (default names, created in the
/// connection's database), for applications that run their schema through
/// `diesel_migrations`:
/// `conn.run_pending_migrations(outbox_diesel::mysql::MIGRATIONS)`.
/// The same tables as [`MysqlOutbox::migrate`] with default names (a test
/// compares the catalogs); its `up.sql` is the default rendering of the
/// schema template.
pub const MIGRATIONS: diesel_migrations::EmbeddedMigrations =
    diesel_migrations::embed_migrations!("migrations-mysql");

diesel_outbox! {
    /// The outbox tables as a Diesel application writes them: enqueue in the
    /// transaction of the business write, and migrate.
    ///
    /// Any relay over the same tables publishes what you enqueue here: the
    /// sqlx store (`outbox_sqlx::mysql::MySqlStore`), [`MysqlStore`], or the
    /// `outbox relay` daemon. The events are the same rows, written by the
    /// same statements.
    MysqlOutbox(AsyncMysqlConnection, Statements);
    /// Enqueues `events` on `conn`, inside your transaction
    /// (`conn.transaction(|conn| async move { … }.scope_boxed())`). Each
    /// outcome says whether a row was written or the `event_id` already
    /// existed (a no-op). The events' partition keys stay locked until your
    /// transaction ends, so writers of one key take turns and a key's
    /// insert order is its commit order. Invalid events are refused before
    /// anything is sent, so your transaction stays usable.
    enqueue
}

impl MysqlOutbox {
    /// The schema DDL for these names (what [`MysqlOutbox::migrate`] runs;
    /// the sqlx store's `schema_sql` is the same text).
    pub fn schema_sql(&self) -> String {
        outbox_sql::mysql::schema_sql(&self.statements.config.tables)
    }

    /// Creates the tables if missing, on `conn` outside any transaction
    /// (MySQL commits DDL at once). Idempotent; tables of another schema
    /// version are refused before anything changes, naming the upgrade
    /// notes.
    pub async fn migrate(&self, conn: &mut AsyncMysqlConnection) -> Result<Migrated, StoreError> {
        self.statements.migrate_on(&mut Diesel(conn)).await
    }
}
