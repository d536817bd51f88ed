//! A store per tenant on one pool, for [`outbox_core::tenants`]: the
//! stores of a server's tenants ([`TenantStores`], one implementation per
//! dialect) and a relay per tenant over them ([`TenantRelays`]).

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::tenants::{TenantId, TenantRelayFactory};
use outbox_core::{OutboxStore, Publisher, Relay, RelayConfig, RelayId, StoreError, WakeUp};

/// Each tenant's store on one server: the same tables in the tenant's
/// schema (PostgreSQL) or database (MySQL/MariaDB), on one pool.
#[async_trait]
pub trait TenantStores: Send + Sync + 'static {
    /// The store type.
    type Store: OutboxStore + 'static;

    /// The store of `tenant`.
    fn store(&self, tenant: &TenantId) -> Result<Self::Store, StoreError>;

    /// Creates `store`'s tables if missing (checks their version).
    async fn migrate(&self, store: &Self::Store) -> Result<(), StoreError>;

    /// Refuses `store` unless its tables exist at this build's schema
    /// version (a relay on missing tables, or on an older version's
    /// functions, must not start).
    async fn check(&self, store: &Self::Store) -> Result<(), StoreError>;

    /// What ends `store`'s relay's idle waits early, if anything (default:
    /// nothing; the relay polls).
    async fn wake_up(&self, _store: &Self::Store) -> Result<Option<Box<dyn WakeUp>>, StoreError> {
        Ok(None)
    }
}

/// Gives each tenant its publisher.
type PublisherFor<P> = Arc<dyn Fn(&TenantId) -> Arc<P> + Send + Sync>;

/// A relay per tenant over `T`'s stores. Each relay's id is
/// `{relay_id}/{tenant}` of the template settings and its metrics carry
/// `tenant`.
pub struct TenantRelays<T, P: ?Sized> {
    stores: T,
    relay: RelayConfig,
    publisher: PublisherFor<P>,
    migrate: bool,
}

impl<T: TenantStores, P: Publisher + ?Sized + 'static> TenantRelays<T, P> {
    /// Relays over `stores` with `relay`'s settings, publishing through
    /// the publisher `publisher` gives each tenant (one shared, or one
    /// each).
    pub fn new(
        stores: T,
        relay: RelayConfig,
        publisher: impl Fn(&TenantId) -> Arc<P> + Send + Sync + 'static,
    ) -> Self {
        Self {
            stores,
            relay,
            publisher: Arc::new(publisher),
            migrate: false,
        }
    }

    /// Runs `migrate()` on a tenant's tables before its relay starts
    /// (default: not; a tenant whose tables are missing or of another
    /// version is then reported and retried until someone migrates it).
    pub fn migrating(mut self) -> Self {
        self.migrate = true;
        self
    }

    /// Each tenant's store, as its relay has it.
    pub fn stores(&self) -> &T {
        &self.stores
    }
}

#[async_trait]
impl<T: TenantStores, P: Publisher + ?Sized + 'static> TenantRelayFactory for TenantRelays<T, P> {
    type Store = T::Store;
    type Publisher = P;

    async fn relay(&self, tenant: &TenantId) -> Result<Relay<T::Store, P>, StoreError> {
        let store = self.stores.store(tenant)?;
        if self.migrate {
            self.stores.migrate(&store).await?;
        } else {
            self.stores.check(&store).await?;
        }
        let wake_up = self.stores.wake_up(&store).await?;
        let config = RelayConfig {
            relay_id: RelayId::new(format!("{}/{tenant}", self.relay.relay_id)),
            tenant: Some(tenant.to_string()),
            ..self.relay.clone()
        };
        let relay = Relay::new(Arc::new(store), (self.publisher)(tenant), config)
            .map_err(|e| StoreError::Config(e.to_string()))?;
        Ok(match wake_up {
            Some(wake_up) => relay.with_wake_up(wake_up),
            None => relay,
        })
    }
}

/// `Ok` when a tenant's tables (`events`) are at `expected`, found at
/// `found` (`None`: missing); else why its relay cannot start.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn tables_current(
    events: &str,
    found: Option<i32>,
    expected: i32,
) -> Result<(), StoreError> {
    match found {
        None => Err(StoreError::Config(format!(
            "no outbox tables ({events}): migrate them (or let the fleet: `migrating()`, `[tenants] migrate = true`)"
        ))),
        found => crate::config::check_schema_version(events, found, expected).map(drop),
    }
}

/// Tenant ids from text read off the database; a name that cannot be a
/// tenant id is refused loudly, not skipped.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn tenant_ids(names: Vec<String>) -> Result<std::collections::BTreeSet<TenantId>, StoreError> {
    names
        .into_iter()
        .map(|name| TenantId::new(name).map_err(|e| StoreError::Config(e.to_string())))
        .collect()
}

/// The tenants a query returns, one text column a row (the rows of a
/// tenants table: `SELECT schema_name FROM tenants WHERE active`), on any
/// of the servers' pools.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Clone, Debug)]
pub struct QueryTenants<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    query: String,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> QueryTenants<DB> {
    /// Tenants as `query`'s rows.
    pub fn new(pool: sqlx::Pool<DB>, query: impl Into<String>) -> Self {
        Self {
            pool,
            query: query.into(),
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
#[async_trait]
impl<DB> outbox_core::tenants::TenantSource for QueryTenants<DB>
where
    DB: sqlx::Database,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    String: sqlx::Type<DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    async fn tenants(&self) -> Result<std::collections::BTreeSet<TenantId>, StoreError> {
        use crate::error::ResultExt;
        let names: Vec<String> = sqlx::query_scalar(&self.query)
            .fetch_all(&self.pool)
            .await
            .store()
            .map_err(|e| e.during("reading tenants", "the tenants query"))?;
        tenant_ids(names)
    }
}

/// Where a dialect lists its schemas or databases holding a table.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug)]
pub(crate) struct Catalog {
    /// `$1`/`?` the name pattern, then the table; one text column a row.
    pub(crate) sql: &'static str,
    /// What the read is called in errors.
    pub(crate) during: &'static str,
    /// The catalog read.
    pub(crate) source: &'static str,
}

/// Every schema (PostgreSQL) or database (MySQL/MariaDB) of the server
/// whose name is `LIKE` a pattern and that holds an outbox (the events
/// table of `tables`' prefix): a tenant appears once `migrate()` has made
/// its tables there, and goes when it is dropped. Built by
/// `PgSchemaTenants::new` or `MySqlDatabaseTenants::new`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Clone, Debug)]
pub struct CatalogTenants<DB: sqlx::Database> {
    pool: sqlx::Pool<DB>,
    pattern: String,
    events_table: String,
    catalog: &'static Catalog,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<DB: sqlx::Database> CatalogTenants<DB> {
    pub(crate) fn in_catalog(
        pool: sqlx::Pool<DB>,
        pattern: String,
        catalog: &'static Catalog,
    ) -> Self {
        Self {
            pool,
            pattern,
            events_table: format!("{}_events", crate::TableNames::default().prefix()),
            catalog,
        }
    }

    /// Looks for the events table of `tables`' prefix instead of the
    /// default one (the schema in `tables` is not read).
    pub fn with_tables(mut self, tables: &crate::TableNames) -> Self {
        self.events_table = format!("{}_events", tables.prefix());
        self
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
#[async_trait]
impl<DB> outbox_core::tenants::TenantSource for CatalogTenants<DB>
where
    DB: sqlx::Database,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    String: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB> + for<'r> sqlx::Decode<'r, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    async fn tenants(&self) -> Result<std::collections::BTreeSet<TenantId>, StoreError> {
        use crate::error::ResultExt;
        let names: Vec<String> = sqlx::query_scalar(self.catalog.sql)
            .bind(self.pattern.clone())
            .bind(self.events_table.clone())
            .fetch_all(&self.pool)
            .await
            .store()
            .map_err(|e| e.during(self.catalog.during, self.catalog.source))?;
        tenant_ids(names)
    }
}
