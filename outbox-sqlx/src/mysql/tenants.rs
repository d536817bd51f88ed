//! A database per tenant on MySQL/MariaDB, for [`outbox_core::tenants`]:
//! where the tenants come from ([`MySqlDatabaseTenants`],
//! [`MySqlQueryTenants`]), each tenant's store on one shared pool
//! ([`MySqlTenantStores`]) and a relay per tenant over them
//! ([`MySqlTenantRelays`]). There is no LISTEN/NOTIFY: an idle tenant's
//! relay polls every `poll_interval`.

use std::collections::BTreeSet;

use async_trait::async_trait;
use outbox_core::StoreError;
use outbox_core::tenants::{TenantId, TenantSource};
use sqlx::MySqlPool;

use super::MySqlStore;
use crate::config::{StoreConfig, TableNames};
use crate::error::ResultExt;
use crate::tenants::{QueryTenants, TenantRelays, TenantStores, tenant_ids};

/// Every database of the server whose name is `LIKE` a pattern and that
/// holds an outbox (the events table of `tables`' prefix): a tenant
/// appears once `migrate()` has made its tables in its database, and goes
/// when its database is dropped.
#[derive(Clone, Debug)]
pub struct MySqlDatabaseTenants {
    pool: MySqlPool,
    pattern: String,
    events_table: String,
}

impl MySqlDatabaseTenants {
    /// Databases `LIKE pattern` (`tenant\_%`) holding `outbox_events`.
    pub fn new(pool: MySqlPool, pattern: impl Into<String>) -> Self {
        Self {
            pool,
            pattern: pattern.into(),
            events_table: format!("{}_events", TableNames::default().prefix()),
        }
    }

    /// Looks for the events table of `tables`' prefix instead of the
    /// default one (the schema in `tables` is not read).
    pub fn with_tables(mut self, tables: &TableNames) -> Self {
        self.events_table = format!("{}_events", tables.prefix());
        self
    }
}

#[async_trait]
impl TenantSource for MySqlDatabaseTenants {
    async fn tenants(&self) -> Result<BTreeSet<TenantId>, StoreError> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(table_schema AS CHAR) FROM information_schema.tables
             WHERE table_schema LIKE ? AND table_name = ?
             ORDER BY 1",
        )
        .bind(&self.pattern)
        .bind(&self.events_table)
        .fetch_all(&self.pool)
        .await
        .store()
        .map_err(|e| e.during("reading tenant databases", "information_schema.tables"))?;
        tenant_ids(names)
    }
}

/// The tenants a query on MySQL/MariaDB returns (see [`QueryTenants`]).
pub type MySqlQueryTenants = QueryTenants<sqlx::MySql>;

/// Each tenant's store: the same tables in the tenant's database, on one
/// pool (the pool's `max_connections` bounds the fleet's, however many
/// tenants).
#[derive(Clone, Debug)]
pub struct MySqlTenantStores {
    pool: MySqlPool,
    config: StoreConfig,
}

impl MySqlTenantStores {
    /// Stores on `pool` with `config` (its table names' schema is replaced
    /// by each tenant's database).
    pub fn new(pool: MySqlPool, config: StoreConfig) -> Self {
        Self { pool, config }
    }
}

#[async_trait]
impl TenantStores for MySqlTenantStores {
    type Store = MySqlStore;

    fn store(&self, tenant: &TenantId) -> Result<MySqlStore, StoreError> {
        let mut config = self.config.clone();
        config.tables = config.tables.clone().in_schema(tenant.as_str())?;
        Ok(MySqlStore::new(self.pool.clone(), config))
    }

    async fn migrate(&self, store: &MySqlStore) -> Result<(), StoreError> {
        store.migrate().await.map(drop)
    }
}

/// A relay per tenant database (see [`TenantRelays`]).
pub type MySqlTenantRelays<P> = TenantRelays<MySqlTenantStores, P>;
