//! A database per tenant on MySQL/MariaDB, for [`outbox_core::tenants`]:
//! where the tenants come from ([`MySqlDatabaseTenants`],
//! [`MySqlQueryTenants`]), each tenant's store on one shared pool
//! ([`MySqlTenantStores`]) and a relay per tenant over them
//! ([`MySqlTenantRelays`]). There is no LISTEN/NOTIFY: an idle tenant's
//! relay polls every `poll_interval`.

use std::str::FromStr;

use async_trait::async_trait;
use outbox_core::StoreError;
use outbox_core::tenants::TenantId;
use sqlx::MySqlPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};

use super::MySqlStore;
use crate::config::StoreConfig;
use crate::tenants::{
    Catalog, CatalogTenants, QueryTenants, ServerPlace, ServerStores, TenantRelays, TenantStores,
    UrlTenantStores, UrlTenants, tables_current,
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

/// The tenants a query on MySQL/MariaDB returns with each one's URL (see
/// [`UrlTenants`]).
pub type MySqlUrlTenants = UrlTenants<sqlx::MySql>;

/// Each tenant's store in the database its URL names, a pool per server
/// (see [`UrlTenantStores`]).
pub type MySqlUrlTenantStores = UrlTenantStores<MySqlTenantStores>;

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

    /// Stores on a pool of at most `connections` to the server of `url`
    /// that connects on first use (a server that is down fails its
    /// tenants' starts, not this call, within
    /// [`TENANT_ACQUIRE_TIMEOUT`](crate::tenants::TENANT_ACQUIRE_TIMEOUT)), for [`UrlTenantStores::new`].
    pub fn lazy(url: &str, connections: u32, config: StoreConfig) -> Result<Self, StoreError> {
        let pool = crate::guard_cancelled_transactions(MySqlPoolOptions::new())
            .max_connections(connections)
            .acquire_timeout(crate::tenants::TENANT_ACQUIRE_TIMEOUT)
            .connect_lazy(url)
            .map_err(|e| StoreError::Config(format!("the server URL: {e}")))?;
        Ok(Self::new(pool, config))
    }
}

#[async_trait]
impl TenantStores for MySqlTenantStores {
    type Store = MySqlStore;

    fn store(&self, tenant: &TenantId) -> Result<MySqlStore, StoreError> {
        self.store_in(Some(tenant.as_str()))
    }

    async fn migrate(&self, _tenant: &TenantId, store: &MySqlStore) -> Result<(), StoreError> {
        store.migrate().await.map(drop)
    }

    async fn check(&self, _tenant: &TenantId, store: &MySqlStore) -> Result<(), StoreError> {
        let found = store.schema_version().await?;
        tables_current(
            &store.config().tables.events(),
            found,
            super::SCHEMA_VERSION,
        )
    }
}

impl ServerStores for MySqlTenantStores {
    /// One pool per server: the URL without its database, which names the
    /// tenant's tables.
    fn locate(url: &str) -> Result<ServerPlace, StoreError> {
        let options =
            MySqlConnectOptions::from_str(url).map_err(|e| StoreError::Config(e.to_string()))?;
        let (scheme, rest) = url.split_once("://").unwrap_or(("mysql", url));
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let query = tail.find('?').map_or("", |at| &tail[at..]);
        Ok(ServerPlace {
            server: format!("{scheme}://{authority}{query}"),
            schema: options.get_database().map(str::to_owned),
        })
    }

    fn store_in(&self, schema: Option<&str>) -> Result<MySqlStore, StoreError> {
        let mut config = self.config.clone();
        let database = schema.or(self.config.tables.schema()).ok_or_else(|| {
            StoreError::Config(
                "no database for the tenant's tables: name it in its URL (mysql://host/db) or its row's third column".into(),
            )
        })?;
        config.tables = config.tables.clone().in_schema(database)?;
        Ok(MySqlStore::new(self.pool.clone(), config))
    }
}

/// A relay per tenant database (see [`TenantRelays`]).
pub type MySqlTenantRelays<P> = TenantRelays<MySqlTenantStores, P>;
