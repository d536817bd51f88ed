//! A schema per tenant on PostgreSQL, for [`outbox_core::tenants`]: where
//! the tenants come from ([`PgSchemaTenants`], [`PgQueryTenants`]) and a
//! relay per tenant's schema on one shared pool ([`PgTenantRelays`]), and
//! their stores for other readers ([`PgTenantStores`]).

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use outbox_core::tenants::{TenantId, TenantRelayFactory, TenantSource};
use outbox_core::{Publisher, Relay, RelayConfig, RelayId, StoreError};
use sqlx::PgPool;

use super::{PgListenHub, PgStore};
use crate::config::{StoreConfig, TableNames};
use crate::error::ResultExt;

/// Tenant ids from text read off the database; a name that cannot be a
/// tenant id (or a schema) is refused loudly, not skipped.
fn tenant_ids(names: Vec<String>) -> Result<BTreeSet<TenantId>, StoreError> {
    names
        .into_iter()
        .map(|name| TenantId::new(name).map_err(|e| StoreError::Config(e.to_string())))
        .collect()
}

/// Every schema of the pool's database whose name is `LIKE` a pattern and
/// that holds an outbox (the events table of `tables`' prefix): a tenant
/// appears once `migrate()` has made its tables in its schema, and goes
/// when its schema is dropped.
#[derive(Clone, Debug)]
pub struct PgSchemaTenants {
    pool: PgPool,
    pattern: String,
    events_table: String,
}

impl PgSchemaTenants {
    /// Schemas `LIKE pattern` (`tenant_%`) holding `outbox_events`.
    pub fn new(pool: PgPool, pattern: impl Into<String>) -> Self {
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
impl TenantSource for PgSchemaTenants {
    async fn tenants(&self) -> Result<BTreeSet<TenantId>, StoreError> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT n.nspname::text FROM pg_namespace n
             WHERE n.nspname LIKE $1
               AND EXISTS (SELECT 1 FROM pg_class c
                           WHERE c.relnamespace = n.oid AND c.relname = $2
                             AND c.relkind IN ('r', 'p'))
             ORDER BY 1",
        )
        .bind(&self.pattern)
        .bind(&self.events_table)
        .fetch_all(&self.pool)
        .await
        .store()
        .map_err(|e| e.during("reading tenant schemas", "pg_namespace"))?;
        tenant_ids(names)
    }
}

/// The tenants a query returns, one text column a row (the rows of a
/// tenants table: `SELECT schema_name FROM tenants WHERE active`).
#[derive(Clone, Debug)]
pub struct PgQueryTenants {
    pool: PgPool,
    query: String,
}

impl PgQueryTenants {
    /// Tenants as `query`'s rows.
    pub fn new(pool: PgPool, query: impl Into<String>) -> Self {
        Self {
            pool,
            query: query.into(),
        }
    }
}

#[async_trait]
impl TenantSource for PgQueryTenants {
    async fn tenants(&self) -> Result<BTreeSet<TenantId>, StoreError> {
        let names: Vec<String> = sqlx::query_scalar(&self.query)
            .fetch_all(&self.pool)
            .await
            .store()
            .map_err(|e| e.during("reading tenants", "the tenants query"))?;
        tenant_ids(names)
    }
}

/// Each tenant's store: `tables` in the tenant's schema, on one pool
/// (without kept connections), for what else reads the tenants (backlog
/// gauges, status) beside their relays.
#[derive(Clone, Debug)]
pub struct PgTenantStores {
    pool: PgPool,
    config: StoreConfig,
}

impl PgTenantStores {
    /// Stores on `pool` with `config` (its table names' schema is replaced
    /// by each tenant's).
    pub fn new(pool: PgPool, config: StoreConfig) -> Self {
        Self { pool, config }
    }

    /// The store of `tenant`'s schema.
    pub fn store(&self, tenant: &TenantId) -> Result<PgStore, StoreError> {
        let mut config = self.config.clone();
        config.tables = config.tables.clone().in_schema(tenant.as_str())?;
        Ok(PgStore::new(self.pool.clone(), config).without_kept_connections())
    }
}

/// Gives each tenant its publisher.
type PublisherFor<P> = Arc<dyn Fn(&TenantId) -> Arc<P> + Send + Sync>;

/// A relay per tenant schema, every store on one pool (without kept
/// connections: the pool's `max_connections` bounds the fleet's, however
/// many tenants). Each relay's id is `{relay_id}/{tenant}` of the template
/// settings and its metrics carry `tenant`; each tenant's tables are
/// `tables` in its schema.
///
/// Every relay wakes on NOTIFY through one [`PgListenHub`] (one connection
/// of the pool, taken at the first tenant's start): an idle tenant costs
/// its backstop poll (`poll_interval`, which a fleet can afford to make
/// long) and its heartbeat, nothing more.
pub struct PgTenantRelays<P: ?Sized> {
    stores: PgTenantStores,
    relay: RelayConfig,
    publisher: PublisherFor<P>,
    migrate: bool,
    /// `None` inside: polling only.
    hub: Option<OnceLock<PgListenHub>>,
}

impl<P: Publisher + ?Sized + 'static> PgTenantRelays<P> {
    /// Relays on `pool` with `relay`'s settings, publishing through the
    /// publisher `publisher` gives each tenant (one shared, or one each).
    pub fn new(
        pool: PgPool,
        relay: RelayConfig,
        publisher: impl Fn(&TenantId) -> Arc<P> + Send + Sync + 'static,
    ) -> Self {
        Self {
            stores: PgTenantStores::new(pool, StoreConfig::default()),
            relay,
            publisher: Arc::new(publisher),
            migrate: false,
            hub: Some(OnceLock::new()),
        }
    }

    /// Relays that poll only, without the shared LISTEN connection (every
    /// connection of the pool then serves claims; each idle tenant polls
    /// every `poll_interval`).
    pub fn polling_only(mut self) -> Self {
        self.hub = None;
        self
    }

    /// Store settings for every tenant (the table names' schema is
    /// replaced by the tenant's).
    pub fn with_store_config(mut self, config: StoreConfig) -> Self {
        self.stores.config = config;
        self
    }

    /// Runs `migrate()` on a tenant's schema before its relay starts
    /// (default: not; a tenant whose tables are missing or of another
    /// version is then reported and retried until someone migrates it).
    pub fn migrating(mut self) -> Self {
        self.migrate = true;
        self
    }

    /// Each tenant's store, as its relay has it.
    pub fn stores(&self) -> &PgTenantStores {
        &self.stores
    }
}

#[async_trait]
impl<P: Publisher + ?Sized + 'static> TenantRelayFactory for PgTenantRelays<P> {
    type Store = PgStore;
    type Publisher = P;

    async fn relay(&self, tenant: &TenantId) -> Result<Relay<PgStore, P>, StoreError> {
        let store = self.stores.store(tenant)?;
        if self.migrate {
            store.migrate().await?;
        }
        let config = RelayConfig {
            relay_id: RelayId::new(format!("{}/{tenant}", self.relay.relay_id)),
            tenant: Some(tenant.to_string()),
            ..self.relay.clone()
        };
        let wake_up = match &self.hub {
            Some(hub) => {
                let hub = hub.get_or_init(|| PgListenHub::start(self.stores.pool.clone()));
                Some(store.wake_up_shared(hub).await?)
            }
            None => None,
        };
        let relay = Relay::new(Arc::new(store), (self.publisher)(tenant), config)
            .map_err(|e| StoreError::Config(e.to_string()))?;
        Ok(match wake_up {
            Some(wake_up) => relay.with_wake_up(wake_up),
            None => relay,
        })
    }
}
