//! A database per tenant on MySQL/MariaDB, for [`outbox_core::tenants`]:
//! where the tenants come from ([`MySqlDatabaseTenants`],
//! [`MySqlQueryTenants`]), each tenant's store on one shared pool
//! ([`MySqlTenantStores`]) and a relay per tenant over them
//! ([`MySqlTenantRelays`]). There is no LISTEN/NOTIFY: an idle tenant's
//! relay polls every `poll_interval`.

use async_trait::async_trait;
use outbox_core::StoreError;
use outbox_core::tenants::TenantId;
use sqlx::MySqlPool;

use super::MySqlStore;
use crate::config::StoreConfig;
use crate::tenants::{
    Catalog, CatalogTenants, QueryTenants, TenantRelays, TenantStores, tables_current,
};

/// Every database of the server whose name is `LIKE` a pattern and that
/// holds an outbox (see [`CatalogTenants`]).
pub type MySqlDatabaseTenants = CatalogTenants<sqlx::MySql>;

static DATABASES: Catalog = Catalog {
    sql: "SELECT CAST(table_schema AS CHAR) FROM information_schema.tables
          WHERE table_schema LIKE ? AND table_name = ?
          ORDER BY 1",
    during: "reading tenant databases",
    source: "information_schema.tables",
};

impl CatalogTenants<sqlx::MySql> {
    /// Databases `LIKE pattern` (`tenant\_%`) holding `outbox_events`.
    pub fn new(pool: MySqlPool, pattern: impl Into<String>) -> Self {
        Self::in_catalog(pool, pattern.into(), &DATABASES)
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

    async fn check(&self, store: &MySqlStore) -> Result<(), StoreError> {
        let found = store.schema_version().await?;
        tables_current(
            &store.config().tables.events(),
            found,
            super::SCHEMA_VERSION,
        )
    }
}

/// A relay per tenant database (see [`TenantRelays`]).
pub type MySqlTenantRelays<P> = TenantRelays<MySqlTenantStores, P>;
