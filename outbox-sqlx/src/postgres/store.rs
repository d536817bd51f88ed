//! [`PgStore`]: the outbox on PostgreSQL.

use outbox_core::store::EnqueueOutcome;
use outbox_core::{NewEvent, StoreError};
use outbox_sql::postgres::Protocol;
use sqlx::{PgConnection, PgPool};

use super::driver::{Sqlx, SqlxDriver};
use crate::config::{Migrated, StoreConfig};

/// The outbox, attempt history, inbox and relay tables on PostgreSQL (≥ 13).
///
/// Clones share the pool. Enqueue inside your own transaction with
/// [`PgStore::enqueue`] (or, from another language, the `outbox_enqueue`
/// SQL function); run relays over the store with [`outbox_core::Relay`],
/// woken by [`PgStore::wake_up`]. The crate README explains the design.
/// The protocol is `outbox-sql`'s, the same the Diesel store runs.
#[derive(Clone)]
pub struct PgStore {
    pub(super) protocol: Protocol<SqlxDriver>,
}

outbox_sql::delegate_sql_store!(PgStore, protocol);

impl PgStore {
    /// A store over `pool`. Table names were validated when built.
    pub fn new(pool: PgPool, config: StoreConfig) -> Self {
        Self {
            protocol: Protocol::new(SqlxDriver { pool, keeps: true }, config),
        }
    }

    /// The store with claims and settlements on connections of the pool,
    /// taken for each statement, instead of two connections it keeps beside
    /// the pool. For many stores on one pool (a schema per tenant, see
    /// `outbox_core::tenants`): connections are then bounded by the pool's
    /// `max_connections`, not by the number of stores. Each connection
    /// plans a store's claim function the first time it runs it there (a
    /// few milliseconds once per connection and tenant). Call it on a new
    /// store: the returned one shares no relay state with `self`'s clones.
    pub fn without_kept_connections(self) -> Self {
        let driver = SqlxDriver {
            pool: self.pool().clone(),
            keeps: false,
        };
        Self {
            protocol: Protocol::new(driver, self.protocol.config.clone()),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.protocol.driver.pool
    }

    /// The NOTIFY channel of these tables (schema and prefix).
    pub fn channel(&self) -> &str {
        &self.protocol.queries.channel
    }

    /// The claim statement, for `EXPLAIN` and review: a call of the
    /// `outbox_claim` function that [`PgStore::schema_sql`] installs.
    /// Parameters: `$1` owner, `$2` limit, `$3` lease in milliseconds, `$4`
    /// crash-loop limit, `$5` per-key order, `$6` block on poison.
    pub fn claim_statement(&self) -> &str {
        &self.protocol.queries.claim
    }

    /// The schema DDL and functions for these table names and limits (what
    /// [`PgStore::migrate`] runs; `migrations/postgres/` holds it rendered
    /// with the defaults).
    pub fn schema_sql(&self) -> String {
        self.protocol.schema_sql()
    }

    /// Creates or updates the tables, indexes, trigger and functions.
    /// Idempotent and quiet; concurrent callers take turns. On tables this
    /// version already made it does nothing (no DDL, no lock a producer
    /// could queue behind); DDL it has to run waits for each lock at most
    /// a second and is retried. Reports the schema version found and left;
    /// tables of another schema version are refused with
    /// [`StoreError::Config`] naming the upgrade notes, before anything is
    /// changed.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        self.protocol.migrate().await
    }

    /// Enqueues `events` on `conn`, typically `&mut *tx` of the business
    /// transaction, in one statement. Each outcome says whether a row was
    /// written or the `event_id` already existed (a no-op). Invalid events
    /// are refused before anything is sent, so the caller's transaction
    /// stays usable.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        self.protocol.enqueue(&mut Sqlx::caller(conn), events).await
    }
}
