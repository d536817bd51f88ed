//! `outbox relay` with `[tenants]`: a PostgreSQL schema or a MySQL/MariaDB
//! database per tenant, every tenant relayed by this process on one pool
//! per server (`outbox_core::tenants`), the tenants found by a pattern, a
//! query of schemas, a query of URLs, or a list.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use outbox_core::tenants::{FleetConfig, TenantFleet, TenantId, TenantList, TenantSource};
use outbox_core::{CancellationToken, Publisher, RelayConfig};
use outbox_sqlx::mysql::{
    MySqlDatabaseTenants, MySqlQueryTenants, MySqlTenantStores, MySqlUrlTenants,
};
use outbox_sqlx::postgres::{PgQueryTenants, PgSchemaTenants, PgTenantStores, PgUrlTenants};
use outbox_sqlx::tenants::{TenantRelays, TenantStores, UrlTenantStores};
use outbox_sqlx::{StoreConfig, TableNames, guard_cancelled_transactions, sqlx};

use super::config::{DaemonConfig, TenantSettings, TenantsFrom, TenantsSection};
use super::http;
use super::served::Served;
use crate::dashboard::{TenantDashboards, Ui};
use crate::error::CliError;
use crate::store::{Store, StoreOf};

/// Each tenant's backstop poll when it wakes on the shared LISTEN and
/// `relay.poll_interval` is not set.
const IDLE_TENANT_POLL: Duration = Duration::from_secs(10);

/// The servers whose tenants a fleet relays.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    /// A schema per tenant, woken through one shared LISTEN.
    Postgres,
    /// A database per tenant, polled.
    MySql,
}

/// The dialect of `url`, or why `[tenants]` cannot serve it.
fn dialect(url: &str, schema: Option<&str>) -> Result<Dialect, CliError> {
    if schema.is_some() {
        return Err(CliError::usage(
            "tenants: each tenant's schema comes from [tenants]; remove schema / --schema",
        ));
    }
    match url.split_once(':').map(|(scheme, _)| scheme) {
        Some("postgres" | "postgresql") => Ok(Dialect::Postgres),
        Some("mysql" | "mariadb") => Ok(Dialect::MySql),
        _ => Err(CliError::usage(
            "tenants: PostgreSQL (a schema per tenant) or MySQL/MariaDB (a database per tenant) only; the URL is neither",
        )),
    }
}

/// The pool that keeps the shared LISTEN and reads the tenants, when the
/// tenants' claims go through shards of their own.
const MAIN_CONNECTIONS: u32 = 2;

/// Connections of each shard of the tenants (PostgreSQL, a schema per
/// tenant): each tenant's statements are cached, and rebuilt after
/// autovacuum, on its shard's connections only (`PgTenantStores::sharded`).
const SHARD_CONNECTIONS: u32 = 3;

/// The shards' sizes for `connections` in all (none below two shards: one
/// pool, as before); the main pool takes [`MAIN_CONNECTIONS`], the last
/// shard any odd one left.
fn shard_sizes(connections: u32) -> Vec<u32> {
    let Some(rest) = connections.checked_sub(MAIN_CONNECTIONS) else {
        return Vec::new();
    };
    let count = rest / SHARD_CONNECTIONS;
    if count < 2 {
        return Vec::new();
    }
    let mut sizes = vec![SHARD_CONNECTIONS; count as usize];
    if let Some(last) = sizes.last_mut() {
        *last += rest % SHARD_CONNECTIONS;
    }
    sizes
}

/// `tenants.list`, checked.
fn listed(list: &[String]) -> Result<TenantList, CliError> {
    let ids = list
        .iter()
        .map(|t| TenantId::new(t.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CliError::usage(format!("tenants.list: {e}")))?;
    Ok(TenantList::new(ids))
}

/// Runs the fleet until a signal (exit 0 after every relay drained).
pub async fn run(
    url: &str,
    schema: Option<&str>,
    prefix: Option<&str>,
    config: &DaemonConfig,
    section: &TenantsSection,
    mut relay: RelayConfig,
    publisher: Arc<dyn Publisher>,
) -> Result<(), CliError> {
    let dialect = dialect(url, schema)?;
    let settings = section.settings(dialect == Dialect::Postgres)?;
    if settings.listen && config.relay.poll_interval.is_none() {
        // Idle tenants wake on NOTIFY: the poll is only the backstop.
        relay.poll_interval = IDLE_TENANT_POLL;
    }
    let tables = match prefix {
        Some(prefix) => TableNames::with_prefix(prefix),
        None => Ok(TableNames::default()),
    }
    .map_err(|e| CliError::usage(format!("prefix: {e}")))?;
    let store_config = StoreConfig::with_tables(tables.clone());
    let unreachable =
        |e: sqlx::Error| CliError::failure(format!("connecting to {}: {e}", super::redacted(url)));
    let fleet_config = FleetConfig {
        refresh: settings.refresh,
        share: settings.share.clone(),
        ..FleetConfig::default()
    };
    let run = FleetRun {
        config,
        settings: &settings,
        relay: &relay,
        url,
        fleet: fleet_config,
        publisher,
        migrate: section.migrate.unwrap_or(false),
    };
    let (connections, listen) = (settings.connections, settings.listen);
    match dialect {
        Dialect::Postgres => {
            let shards = shard_sizes(connections);
            let main = match shards.is_empty() {
                true => connections,
                false => MAIN_CONNECTIONS,
            };
            let pool = guard_cancelled_transactions(sqlx::postgres::PgPoolOptions::new())
                .max_connections(main)
                .connect(url)
                .await
                .map_err(unreachable)?;
            let polling = move |stores: PgTenantStores| match listen {
                true => stores,
                false => stores.polling_only(),
            };
            let source: Box<dyn TenantSource> = match &settings.from {
                TenantsFrom::Urls(query) => {
                    let source = PgUrlTenants::new(pool, query.clone());
                    let stores = UrlTenantStores::new(source.urls(), move |url| {
                        PgTenantStores::lazy(url, connections, store_config.clone()).map(polling)
                    });
                    return run.serve(source, stores, Store::Postgres).await;
                }
                TenantsFrom::SchemasLike(pattern) => Box::new(
                    PgSchemaTenants::new(pool.clone(), pattern.clone()).with_tables(&tables),
                ),
                TenantsFrom::Query(query) => {
                    Box::new(PgQueryTenants::new(pool.clone(), query.clone()))
                }
                TenantsFrom::List(list) => Box::new(listed(list)?),
            };
            let shards = shards
                .into_iter()
                .map(|size| {
                    guard_cancelled_transactions(sqlx::postgres::PgPoolOptions::new())
                        .max_connections(size)
                        .connect_lazy(url)
                        .map_err(unreachable)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let stores = polling(PgTenantStores::new(pool, store_config)).sharded(shards);
            run.serve(source, stores, Store::Postgres).await
        }
        Dialect::MySql => {
            let url = format!("mysql:{}", url.split_once(':').map_or("", |(_, rest)| rest));
            let pool = guard_cancelled_transactions(sqlx::mysql::MySqlPoolOptions::new())
                .max_connections(connections)
                .connect(&url)
                .await
                .map_err(unreachable)?;
            let source: Box<dyn TenantSource> = match &settings.from {
                TenantsFrom::Urls(query) => {
                    let source = MySqlUrlTenants::new(pool, query.clone());
                    let stores = UrlTenantStores::new(source.urls(), move |url| {
                        MySqlTenantStores::lazy(url, connections, store_config.clone())
                    });
                    return run.serve(source, stores, Store::MySql).await;
                }
                TenantsFrom::SchemasLike(pattern) => Box::new(
                    MySqlDatabaseTenants::new(pool.clone(), pattern.clone()).with_tables(&tables),
                ),
                TenantsFrom::Query(query) => {
                    Box::new(MySqlQueryTenants::new(pool.clone(), query.clone()))
                }
                TenantsFrom::List(list) => Box::new(listed(list)?),
            };
            let stores = MySqlTenantStores::new(pool, store_config);
            run.serve(source, stores, Store::MySql).await
        }
    }
}

/// What a fleet's run reads besides its tenants and their stores.
struct FleetRun<'a> {
    config: &'a DaemonConfig,
    settings: &'a TenantSettings,
    relay: &'a RelayConfig,
    url: &'a str,
    fleet: FleetConfig,
    publisher: Arc<dyn Publisher>,
    /// `[tenants] migrate`.
    migrate: bool,
}

impl FleetRun<'_> {
    /// Runs a relay per tenant of `source` over `stores` (with the purge,
    /// `/metrics`, `/health` and dashboard over them) until a signal;
    /// `wrap` makes a store the daemon's other readers take.
    async fn serve<T: TenantStores + Clone>(
        self,
        source: impl TenantSource + 'static,
        stores: T,
        wrap: fn(T::Store) -> Store,
    ) -> Result<(), CliError> {
        let store_of: StoreOf = {
            let stores = stores.clone();
            Arc::new(move |tenant| Ok(wrap(stores.store(tenant)?)))
        };
        let publisher = self.publisher.clone();
        let mut relays = TenantRelays::new(stores, self.relay.clone(), move |_| publisher.clone());
        if self.migrate {
            relays = relays.migrating();
        }
        let fleet = TenantFleet::new(source, relays, self.fleet.clone());
        let served = Served::Tenants {
            fleet: fleet.status(),
            store_of: store_of.clone(),
        };
        let shutdown = CancellationToken::new();
        let running = Arc::new(AtomicBool::new(true));
        if let Some((older_than, every)) = self.config.purge_schedule()? {
            tokio::spawn(super::purge_loop(
                served.clone(),
                older_than,
                every,
                shutdown.clone(),
            ));
        }
        if let Some(section) = &self.config.http {
            let handle = http::install_recorder()?;
            let listener = tokio::net::TcpListener::bind(&section.listen)
                .await
                .map_err(|e| CliError::usage(format!("http.listen {}: {e}", section.listen)))?;
            tracing::info!(listen = %section.listen, "serving /metrics and /health");
            let dashboard = section.dashboard_path()?.map(|base| {
                tracing::info!(path = %base, "serving the dashboard's tenant picker");
                Ui::Tenants(TenantDashboards::new(
                    super::dashboard_settings(base, &listener),
                    fleet.status(),
                    store_of,
                ))
            });
            tokio::spawn(http::serve(
                listener,
                handle,
                Some(served),
                http::Liveness {
                    running: running.clone(),
                    watched: http::Watched::Tenants(fleet.status()),
                    outage_unhealthy_after: section.outage_unhealthy_after()?,
                },
                dashboard,
            ));
        }
        tokio::spawn(super::stop_on_signal(shutdown.clone()));
        let settings = self.settings;
        tracing::info!(
            relay = %self.relay.relay_id,
            url = %super::redacted(self.url),
            tenants = ?settings.from,
            refresh = ?settings.refresh,
            connections = settings.connections,
            listen = settings.listen,
            poll = ?self.relay.poll_interval,
            "relaying tenants"
        );
        let report = fleet.run(shutdown).await;
        running.store(false, AtomicOrdering::SeqCst);
        tracing::info!(
            tenants = report.tenants.len(),
            failures = report.failures,
            "every tenant's relay drained"
        );
        super::log_stopped(&report.total(), "relay stopped (every tenant)");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::shard_sizes;

    #[test]
    fn connections_are_split_into_shards_of_three_beside_the_main_pool() {
        assert!(shard_sizes(2).is_empty());
        assert!(shard_sizes(7).is_empty());
        assert_eq!(shard_sizes(8), [3, 3]);
        assert_eq!(shard_sizes(9), [3, 4]);
        assert_eq!(shard_sizes(10), [3, 5]);
        assert_eq!(shard_sizes(11), [3, 3, 3]);
        for connections in 0..64 {
            let shards: u32 = shard_sizes(connections).iter().sum();
            let main = if shards == 0 { connections } else { 2 };
            assert_eq!(shards + main, connections.max(main), "{connections}");
        }
    }
}
