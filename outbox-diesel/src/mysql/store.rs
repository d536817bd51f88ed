//! [`MysqlStore`]: the relay side on diesel-async with a deadpool pool —
//! claim, settle, heartbeat, the operator's view and repairs — running
//! `outbox-sql`'s MySQL protocol, the one the sqlx store runs.

use diesel_async::AsyncMysqlConnection;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use outbox_core::StoreError;
use outbox_sql::mysql::Protocol;
use outbox_sql::{Migrated, StoreConfig};

use super::MysqlOutbox;
use super::driver::DieselDriver;

/// The outbox on MySQL 8 / MariaDB ≥ 10.6 through diesel-async:
/// [`outbox_core::OutboxStore`], [`outbox_core::OutboxWriter`],
/// [`outbox_core::OutboxAdmin`] and (by [`MysqlStore::inbox`])
/// [`outbox_core::InboxStore`] over a deadpool pool of
/// [`AsyncMysqlConnection`]s. Enqueue inside your own transaction with
/// [`MysqlStore::outbox`]; run relays over the store with
/// [`outbox_core::Relay`].
#[derive(Clone)]
pub struct MysqlStore {
    pub(super) protocol: Protocol<DieselDriver>,
}

outbox_sql::delegate_mysql_store!(MysqlStore, protocol);

impl MysqlStore {
    /// A store over `pool` on `config`'s tables.
    pub fn new(pool: Pool<AsyncMysqlConnection>, config: StoreConfig) -> Self {
        Self {
            protocol: Protocol::new(DieselDriver(pool), config),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<AsyncMysqlConnection> {
        &self.protocol.driver.0
    }

    /// Enqueue and migrate on connections of your own.
    pub fn outbox(&self) -> MysqlOutbox {
        MysqlOutbox {
            statements: self.protocol.statements.clone(),
        }
    }

    pub(super) async fn conn(&self) -> Result<Object<AsyncMysqlConnection>, StoreError> {
        self.protocol.driver.conn().await
    }

    /// A pooled connection, store time synced first.
    pub(super) async fn synced_conn(&self) -> Result<Object<AsyncMysqlConnection>, StoreError> {
        self.protocol.sync_clock().await?;
        self.conn().await
    }

    /// Creates the tables if missing on a pooled connection (see
    /// [`MysqlOutbox::migrate`]).
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        self.protocol.migrate().await
    }
}
