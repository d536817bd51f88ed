//! [`MySqlStore`]: the outbox on MySQL 8 / MariaDB ≥ 10.6.

use outbox_core::store::EnqueueOutcome;
use outbox_core::{NewEvent, StoreError};
use outbox_sql::mysql::Protocol;
use sqlx::{MySqlConnection, MySqlPool};

use super::driver::{Sqlx, SqlxDriver};
use crate::config::{Migrated, StoreConfig};

/// The outbox, attempt history, inbox and relay tables on MySQL 8 or
/// MariaDB ≥ 10.6.
///
/// Enqueue takes a row lock per partition key until commit, so writers of one
/// key take turns and a key's insert order is its commit order.
/// Claims take turns on a one-row lock table and lease rows found with
/// `FOR UPDATE SKIP LOCKED` (there is no `UPDATE … RETURNING`). Relay
/// transactions run at READ COMMITTED, so they lock only the rows they
/// touch and never a gap a producer inserts into. Every time is the
/// database server's clock. The protocol is `outbox-sql`'s, the same the
/// Diesel store runs.
#[derive(Clone)]
pub struct MySqlStore {
    pub(super) protocol: Protocol<SqlxDriver>,
}

outbox_sql::delegate_mysql_store!(MySqlStore, protocol);

impl MySqlStore {
    /// A store over `pool`.
    pub fn new(pool: MySqlPool, config: StoreConfig) -> Self {
        Self {
            protocol: Protocol::new(SqlxDriver(pool), config),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.protocol.driver.0
    }

    /// The schema DDL for these table names (what [`MySqlStore::migrate`] runs).
    pub fn schema_sql(&self) -> String {
        outbox_sql::mysql::schema_sql(&self.protocol.config.tables)
    }

    /// Creates the tables if missing. Idempotent; reports the schema
    /// version found and left. Tables of another schema version are refused
    /// with [`StoreError::Config`] naming the upgrade notes.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        self.protocol.migrate().await
    }

    /// Enqueues `events` on `conn`, typically `&mut *tx` of the business
    /// transaction. Locks the events' partition keys until that transaction
    /// ends (see the type's docs). Invalid events are refused before anything
    /// is sent.
    pub async fn enqueue(
        &self,
        conn: &mut MySqlConnection,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        self.protocol.enqueue(&mut Sqlx(conn), events).await
    }
}
