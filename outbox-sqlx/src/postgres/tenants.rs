//! A schema per tenant on PostgreSQL, for [`outbox_core::tenants`]: where
//! the tenants come from ([`PgSchemaTenants`], [`PgQueryTenants`]), each
//! tenant's store on one shared pool ([`PgTenantStores`]) and a relay per
//! tenant over them ([`PgTenantRelays`]).

use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use outbox_core::tenants::TenantId;
use outbox_core::{StoreError, WakeUp};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::{PgListenHub, PgStore};
use crate::config::StoreConfig;
use crate::tenants::{
    Catalog, CatalogTenants, QueryTenants, ServerPlace, ServerStores, TenantRelays, TenantStores,
    UrlTenantStores, UrlTenants, tables_current,
};

/// Every schema of the pool's database whose name is `LIKE` a pattern and
/// that holds an outbox (see [`CatalogTenants`]).
pub type PgSchemaTenants = CatalogTenants<sqlx::Postgres>;

static SCHEMAS: Catalog = Catalog {
    sql: "SELECT n.nspname::text FROM pg_namespace n
          WHERE n.nspname LIKE $1
            AND EXISTS (SELECT 1 FROM pg_class c
                        WHERE c.relnamespace = n.oid AND c.relname = $2
                          AND c.relkind IN ('r', 'p'))
          ORDER BY 1",
    during: "reading tenant schemas",
    source: "pg_namespace",
};

impl CatalogTenants<sqlx::Postgres> {
    /// Schemas `LIKE pattern` (`tenant_%`) holding `outbox_events`.
    pub fn new(pool: PgPool, pattern: impl Into<String>) -> Self {
        Self::in_catalog(pool, pattern.into(), &SCHEMAS)
    }
}

/// The tenants a query on PostgreSQL returns (see [`QueryTenants`]).
pub type PgQueryTenants = QueryTenants<sqlx::Postgres>;

/// The tenants a query on PostgreSQL returns with each one's database URL
/// (see [`UrlTenants`]).
pub type PgUrlTenants = UrlTenants<sqlx::Postgres>;

/// Each tenant's store in the database its URL names, a pool per database
/// (see [`UrlTenantStores`]).
pub type PgUrlTenantStores = UrlTenantStores<PgTenantStores>;

/// Each tenant's store: the same tables in the tenant's schema, on one
/// pool without kept connections (the pool's `max_connections` bounds the
/// fleet's, however many tenants).
///
/// Every relay wakes on NOTIFY through one [`PgListenHub`] (one connection
/// of the pool, taken at the first tenant's start): an idle tenant costs
/// its backstop poll (`poll_interval`, which a fleet can afford to make
/// long) and its heartbeat, nothing more.
#[derive(Clone, Debug)]
pub struct PgTenantStores {
    pool: PgPool,
    config: StoreConfig,
    /// `None` inside: polling only.
    hub: Option<Arc<OnceLock<PgListenHub>>>,
}

impl PgTenantStores {
    /// Stores on `pool` with `config` (its table names' schema is replaced
    /// by each tenant's).
    pub fn new(pool: PgPool, config: StoreConfig) -> Self {
        Self {
            pool,
            config,
            hub: Some(Arc::default()),
        }
    }

    /// Stores on a pool of at most `connections` to `url` that connects on
    /// first use (a database that is down fails its tenants' starts, not
    /// this call, within [`TENANT_ACQUIRE_TIMEOUT`](crate::tenants::TENANT_ACQUIRE_TIMEOUT)), for [`UrlTenantStores::new`].
    pub fn lazy(url: &str, connections: u32, config: StoreConfig) -> Result<Self, StoreError> {
        let pool = crate::guard_cancelled_transactions(PgPoolOptions::new())
            .max_connections(connections)
            .acquire_timeout(crate::tenants::TENANT_ACQUIRE_TIMEOUT)
            .connect_lazy(url)
            .map_err(|e| StoreError::Config(format!("the database URL: {e}")))?;
        Ok(Self::new(pool, config))
    }

    /// Relays that poll only, without the shared LISTEN connection (every
    /// connection of the pool then serves claims; each idle tenant polls
    /// every `poll_interval`).
    pub fn polling_only(mut self) -> Self {
        self.hub = None;
        self
    }
}

#[async_trait]
impl TenantStores for PgTenantStores {
    type Store = PgStore;

    fn store(&self, tenant: &TenantId) -> Result<PgStore, StoreError> {
        self.store_in(Some(tenant.as_str()))
    }

    async fn migrate(&self, _tenant: &TenantId, store: &PgStore) -> Result<(), StoreError> {
        store.migrate().await.map(drop)
    }

    async fn check(&self, _tenant: &TenantId, store: &PgStore) -> Result<(), StoreError> {
        let found = store.schema_version().await?;
        tables_current(
            &store.config().tables.events(),
            found,
            super::SCHEMA_VERSION,
        )
    }

    async fn wake_up(
        &self,
        _tenant: &TenantId,
        store: &PgStore,
    ) -> Result<Option<Box<dyn WakeUp>>, StoreError> {
        let Some(hub) = &self.hub else {
            return Ok(None);
        };
        let hub = hub.get_or_init(|| PgListenHub::start(self.pool.clone()));
        Ok(Some(Box::new(store.wake_up_shared(hub).await?)))
    }
}

impl ServerStores for PgTenantStores {
    fn locate(url: &str) -> Result<ServerPlace, StoreError> {
        PgConnectOptions::from_str(url).map_err(|e| StoreError::Config(e.to_string()))?;
        Ok(ServerPlace {
            server: url.to_owned(),
            schema: None,
        })
    }

    fn store_in(&self, schema: Option<&str>) -> Result<PgStore, StoreError> {
        let mut config = self.config.clone();
        if let Some(schema) = schema {
            config.tables = config.tables.clone().in_schema(schema)?;
        }
        Ok(PgStore::new(self.pool.clone(), config).without_kept_connections())
    }
}

/// A relay per tenant schema (see [`TenantRelays`]).
pub type PgTenantRelays<P> = TenantRelays<PgTenantStores, P>;
