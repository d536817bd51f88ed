//! [`PgStore`]: the relay side on diesel-async with a deadpool pool — claim,
//! settle, heartbeat, the operator's view and repairs — on `outbox-sql`'s
//! protocol, the one the sqlx store runs.

use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use outbox_core::StoreError;
use outbox_sql::postgres::Protocol;
use outbox_sql::{Migrated, StoreConfig};

use super::PgOutbox;
use super::driver::{Diesel, DieselDriver};

/// The outbox on PostgreSQL through diesel-async: [`outbox_core::OutboxStore`],
/// [`outbox_core::OutboxWriter`], [`outbox_core::OutboxAdmin`] and (by
/// [`PgStore::inbox`]) [`outbox_core::InboxStore`] over a deadpool pool of
/// [`AsyncPgConnection`]s. Enqueue inside your own transaction with
/// [`PgStore::outbox`]'s [`PgOutbox::enqueue`]; run relays over the store
/// with [`outbox_core::Relay`] (it polls: LISTEN/NOTIFY wake-ups are the
/// sqlx store's).
#[derive(Clone)]
pub struct PgStore {
    pub(super) protocol: Protocol<DieselDriver>,
    pub(super) outbox: PgOutbox,
}

outbox_sql::delegate_sql_store!(PgStore, protocol);

impl PgStore {
    /// A store over `pool` on `config`'s tables.
    pub fn new(pool: Pool<AsyncPgConnection>, config: StoreConfig) -> Self {
        Self {
            protocol: Protocol::new(DieselDriver(pool), config.clone()),
            outbox: PgOutbox::new(config),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<AsyncPgConnection> {
        &self.protocol.driver.0
    }

    /// Enqueue and migrate on connections of your own.
    pub fn outbox(&self) -> &PgOutbox {
        &self.outbox
    }

    /// Creates or updates the tables on a pooled connection (see
    /// [`PgOutbox::migrate`]).
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        let mut conn = self.conn().await?;
        self.outbox.migrate(&mut conn).await
    }

    /// A pooled connection; a pool that cannot give one is unavailable.
    pub(super) async fn conn(&self) -> Result<Object<AsyncPgConnection>, StoreError> {
        self.protocol.driver.conn().await
    }

    /// Tests shift store time: the shift is kept in the database, so every
    /// handle agrees.
    pub(super) async fn sync_clock(&self, conn: &mut AsyncPgConnection) -> Result<(), StoreError> {
        self.protocol.sync_clock_on(&mut Diesel(conn)).await
    }

    /// A pooled connection with store time synced on it.
    pub(super) async fn synced_conn(&self) -> Result<Object<AsyncPgConnection>, StoreError> {
        let mut conn = self.conn().await?;
        self.sync_clock(&mut conn).await?;
        Ok(conn)
    }
}
