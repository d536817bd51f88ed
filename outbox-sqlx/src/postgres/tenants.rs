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
///
/// Every connection a tenant's claims go through keeps that tenant's
/// parsed statements and table descriptions, and rebuilds them whenever
/// autovacuum or DDL touches the tenant's tables: with every tenant on
/// every connection, an autovacuum sweep costs each connection a claim's
/// worth of rebuilding per tenant at once (about 3 ms each; a second of
/// two cores at 100 tenants on 6 connections). [`sharded`](Self::sharded)
/// gives each tenant a shard of the connections instead.
#[derive(Clone, Debug)]
pub struct PgTenantStores {
    pool: PgPool,
    /// Each tenant's claims go through one of these, by its id's hash
    /// (empty: through `pool`).
    shards: Arc<[PgPool]>,
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
            shards: Arc::from([]),
            config,
            hub: Some(Arc::default()),
        }
    }

    /// Each tenant's store on one of `shards` (by a hash of its id) rather
    /// than on the pool given to [`new`](Self::new), which keeps the shared
    /// LISTEN connection. A tenant's cached statements then live on its
    /// shard's connections only, and a burst of rebuilding after
    /// autovacuum costs each connection its shard's tenants, not every
    /// tenant. One tenant's drain shares its shard with fewer others.
    pub fn sharded(mut self, shards: Vec<PgPool>) -> Self {
        self.shards = shards.into();
        self
    }

    /// A store of the tables in `schema` (the default one if `None`) on
    /// `pool`.
    fn store_on(&self, pool: &PgPool, schema: Option<&str>) -> Result<PgStore, StoreError> {
        let mut config = self.config.clone();
        if let Some(schema) = schema {
            config.tables = config.tables.clone().in_schema(schema)?;
        }
        Ok(PgStore::new(pool.clone(), config).without_kept_connections())
    }

    /// The pool `tenant`'s store uses.
    fn pool_of(&self, tenant: &TenantId) -> &PgPool {
        if self.shards.is_empty() {
            return &self.pool;
        }
        // FNV-1a: the same shard for a tenant in every process and build.
        let hash = tenant
            .as_str()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
        &self.shards[(hash % self.shards.len() as u64) as usize]
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
        self.store_on(self.pool_of(tenant), Some(tenant.as_str()))
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
        self.store_on(&self.pool, schema)
    }
}

/// A relay per tenant schema (see [`TenantRelays`]).
pub type PgTenantRelays<P> = TenantRelays<PgTenantStores, P>;

#[cfg(test)]
mod tests {
    use super::*;

    fn lazy_pool(application: &str) -> PgPool {
        let options = PgConnectOptions::new()
            .host("127.0.0.1")
            .application_name(application);
        PgPoolOptions::new().connect_lazy_with(options)
    }

    fn application_of(stores: &PgTenantStores, tenant: &str) -> String {
        let store = stores.store(&TenantId::new(tenant).unwrap()).unwrap();
        let options = store.pool().connect_options();
        options
            .get_application_name()
            .unwrap_or_default()
            .to_owned()
    }

    #[tokio::test]
    async fn each_tenant_keeps_to_one_shard_and_every_shard_serves_some() {
        let plain = PgTenantStores::new(lazy_pool("main"), StoreConfig::default());
        assert_eq!(application_of(&plain, "acme"), "main");
        let shards = ["s0", "s1", "s2"];
        let sharded = plain
            .clone()
            .sharded(shards.iter().map(|s| lazy_pool(s)).collect());
        let mut used = std::collections::BTreeSet::new();
        for n in 0..30 {
            let tenant = format!("tenant_{n}");
            let shard = application_of(&sharded, &tenant);
            assert!(shards.contains(&shard.as_str()), "{shard}");
            assert_eq!(application_of(&sharded, &tenant), shard, "stable");
            used.insert(shard);
        }
        assert_eq!(used.len(), shards.len(), "{used:?}");
    }
}
