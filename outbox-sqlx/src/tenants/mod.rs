//! A store per tenant, for [`outbox_core::tenants`]: the stores of a
//! server's tenants on one pool ([`TenantStores`], one implementation per
//! dialect), the stores of tenants spread over servers, a pool per server
//! ([`UrlTenantStores`]), where the tenants come from ([`QueryTenants`],
//! [`CatalogTenants`], [`UrlTenants`]) and a relay per tenant over them
//! ([`TenantRelays`]).

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::tenants::{TenantId, TenantRelayFactory};
use outbox_core::{OutboxStore, Publisher, Relay, RelayConfig, RelayId, StoreError, WakeUp};

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sources;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod urls;

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use sources::Catalog;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use sources::{CatalogTenants, QueryTenants, TenantDatabase};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use urls::{ServerPlace, ServerStores, TenantPlace, TenantUrls, UrlTenantStores, UrlTenants};

/// How long a tenant's pool made from its URL (`PgTenantStores::lazy`,
/// `MySqlTenantStores::lazy`) waits for a connection, connecting included:
/// a server that refuses connections fails its tenants' starts after this
/// (and they are reported), not after sqlx's default 30 s.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub const TENANT_ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Each tenant's store on one server: the same tables in the tenant's
/// schema (PostgreSQL) or database (MySQL/MariaDB), on one pool.
#[async_trait]
pub trait TenantStores: Send + Sync + 'static {
    /// The store type.
    type Store: OutboxStore + 'static;

    /// The store of `tenant`.
    fn store(&self, tenant: &TenantId) -> Result<Self::Store, StoreError>;

    /// Creates `tenant`'s tables (`store`) if missing (checks their
    /// version).
    async fn migrate(&self, tenant: &TenantId, store: &Self::Store) -> Result<(), StoreError>;

    /// Refuses `tenant`'s tables (`store`) unless they exist at this
    /// build's schema version (a relay on missing tables, or on an older
    /// version's functions, must not start).
    async fn check(&self, tenant: &TenantId, store: &Self::Store) -> Result<(), StoreError>;

    /// What ends `tenant`'s relay's idle waits early, if anything
    /// (default: nothing; the relay polls).
    async fn wake_up(
        &self,
        _tenant: &TenantId,
        _store: &Self::Store,
    ) -> Result<Option<Box<dyn WakeUp>>, StoreError> {
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
            self.stores.migrate(tenant, &store).await?;
        } else {
            self.stores.check(tenant, &store).await?;
        }
        let wake_up = self.stores.wake_up(tenant, &store).await?;
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
