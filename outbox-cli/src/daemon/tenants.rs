//! `outbox relay` with `[tenants]`: a PostgreSQL schema per tenant, every
//! tenant relayed by this process on one pool (`outbox_core::tenants`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use outbox_core::tenants::{FleetConfig, TenantFleet, TenantId, TenantList, TenantSource};
use outbox_core::{CancellationToken, Publisher, RelayConfig};
use outbox_sqlx::postgres::{PgQueryTenants, PgSchemaTenants, PgTenantRelays};
use outbox_sqlx::{StoreConfig, TableNames};

use super::config::{DaemonConfig, TenantSettings, TenantsFrom, TenantsSection};
use super::http;
use super::served::Served;
use crate::dashboard::{TenantDashboards, Ui};
use crate::error::CliError;
use crate::store::{Store, StoreOf};

/// Each tenant's backstop poll when it wakes on the shared LISTEN and
/// `relay.poll_interval` is not set.
const IDLE_TENANT_POLL: Duration = Duration::from_secs(10);

/// What `[tenants]` cannot be combined with, each refused by name.
fn refuse_unsupported(url: &str, schema: Option<&str>) -> Result<(), CliError> {
    let refused = if !url.starts_with("postgres") {
        Some("tenants: PostgreSQL only (a schema per tenant); the URL is not postgres://")
    } else if schema.is_some() {
        Some("tenants: each tenant's schema comes from [tenants]; remove schema / --schema")
    } else {
        None
    };
    refused.map_or(Ok(()), |message| Err(CliError::usage(message)))
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
    refuse_unsupported(url, schema)?;
    let TenantSettings {
        from,
        refresh,
        connections,
        listen,
    } = section.settings()?;
    if listen && config.relay.poll_interval.is_none() {
        // Idle tenants wake on NOTIFY: the poll is only the backstop.
        relay.poll_interval = IDLE_TENANT_POLL;
    }
    let tables = match prefix {
        Some(prefix) => TableNames::with_prefix(prefix),
        None => Ok(TableNames::default()),
    }
    .map_err(|e| CliError::usage(format!("prefix: {e}")))?;
    let pool = outbox_sqlx::guard_cancelled_transactions(
        outbox_sqlx::sqlx::postgres::PgPoolOptions::new(),
    )
    .max_connections(connections)
    .connect(url)
    .await
    .map_err(|e| CliError::failure(format!("connecting to {}: {e}", super::redacted(url))))?;
    let source: Box<dyn TenantSource> = match &from {
        TenantsFrom::SchemasLike(pattern) => {
            Box::new(PgSchemaTenants::new(pool.clone(), pattern.clone()).with_tables(&tables))
        }
        TenantsFrom::Query(query) => Box::new(PgQueryTenants::new(pool.clone(), query.clone())),
        TenantsFrom::List(list) => Box::new(TenantList::new(
            list.iter()
                .map(|t| TenantId::new(t.clone()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| CliError::usage(format!("tenants.list: {e}")))?,
        )),
    };
    let mut factory = PgTenantRelays::new(pool, relay.clone(), move |_| publisher.clone())
        .with_store_config(StoreConfig::with_tables(tables));
    if section.migrate.unwrap_or(false) {
        factory = factory.migrating();
    }
    if !listen {
        factory = factory.polling_only();
    }
    let stores = factory.stores().clone();
    let fleet = TenantFleet::new(
        source,
        factory,
        FleetConfig {
            refresh,
            ..FleetConfig::default()
        },
    );
    let store_of: StoreOf = Arc::new(move |tenant| Ok(Store::Postgres(stores.store(tenant)?)));
    let served = Served::Tenants {
        fleet: fleet.status(),
        store_of: store_of.clone(),
    };
    let shutdown = CancellationToken::new();
    let running = Arc::new(AtomicBool::new(true));
    if let Some((older_than, every)) = config.purge_schedule()? {
        tokio::spawn(super::purge_loop(
            served.clone(),
            older_than,
            every,
            shutdown.clone(),
        ));
    }
    if let Some(section) = &config.http {
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
            Some(served.clone()),
            http::Liveness {
                running: running.clone(),
                watched: http::Watched::Tenants(fleet.status()),
                outage_unhealthy_after: section.outage_unhealthy_after()?,
            },
            dashboard,
        ));
    }
    tokio::spawn(super::stop_on_signal(shutdown.clone()));
    tracing::info!(
        relay = %relay.relay_id,
        url = %super::redacted(url),
        tenants = ?from,
        refresh = ?refresh,
        connections,
        listen,
        poll = ?relay.poll_interval,
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
