//! A database per tenant on MariaDB, every tenant relayed by one fleet on
//! one pool (issue 36): databases created and dropped while it runs, an
//! unmigrated tenant from a tenants table reported and retried on its own
//! while the others flow, ten tenants on a pool of three connections, and
//! tenants named by URL sharing their server's pool, one whose password is
//! wrong failing alone.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::memory::RecordingPublisher;
use outbox_core::tenants::{TenantFleet, TenantId, TenantSource, TenantState};
use outbox_core::testing::event;
use outbox_core::{CancellationToken, EventId, OutboxWriter, RelayConfig, RelayId};
use outbox_sqlx::mysql::{
    MySqlDatabaseTenants, MySqlQueryTenants, MySqlStore, MySqlTenantRelays, MySqlTenantStores,
    MySqlUrlTenants,
};
use outbox_sqlx::tenants::{TenantRelays, UrlTenantStores};
use outbox_sqlx::{StoreConfig, TableNames};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};

use super::support::tenants::{quick_fleet, until};
use super::{pool, support, url};

/// Each tenant's recording publisher, made on first use.
#[derive(Clone, Default)]
struct Publishers(Arc<Mutex<HashMap<String, Arc<RecordingPublisher>>>>);

impl Publishers {
    fn of(&self, tenant: &str) -> Arc<RecordingPublisher> {
        let mut all = self.0.lock().unwrap();
        all.entry(tenant.to_owned()).or_default().clone()
    }

    fn published(&self, tenant: &str) -> BTreeSet<EventId> {
        self.of(tenant).delivered_ids().into_iter().collect()
    }

    fn relays(&self, pool: &MySqlPool) -> MySqlTenantRelays<RecordingPublisher> {
        let publishers = self.clone();
        let relay = RelayConfig {
            relay_id: RelayId::new("fleet"),
            poll_interval: Duration::from_millis(20),
            ..RelayConfig::default()
        };
        let stores = MySqlTenantStores::new(pool.clone(), StoreConfig::default());
        MySqlTenantRelays::new(stores, relay, move |t| publishers.of(t.as_str()))
    }
}

fn fleet<S: TenantSource + 'static>(
    source: S,
    relays: MySqlTenantRelays<RecordingPublisher>,
) -> (
    TenantFleet<MySqlTenantRelays<RecordingPublisher>>,
    CancellationToken,
) {
    (
        TenantFleet::new(source, relays, quick_fleet()),
        CancellationToken::new(),
    )
}

/// A tenant database, migrated if asked, holding `n` events.
async fn tenant(
    pool: &MySqlPool,
    database: &str,
    migrate: bool,
    n: usize,
) -> (MySqlStore, BTreeSet<EventId>) {
    sqlx::query(&format!("CREATE DATABASE IF NOT EXISTS {database}"))
        .execute(pool)
        .await
        .unwrap();
    let tables = TableNames::default().in_schema(database).unwrap();
    let store = MySqlStore::new(pool.clone(), StoreConfig::with_tables(tables));
    if !migrate {
        return (store, BTreeSet::new());
    }
    store.migrate().await.unwrap();
    let events: Vec<_> = (0..n).map(|i| event(&format!("k{}", i % 3), i)).collect();
    OutboxWriter::enqueue(&store, &events).await.unwrap();
    (store, events.iter().map(|e| e.event_id).collect())
}

async fn drop_databases(pool: &MySqlPool, databases: &[&str]) {
    for database in databases {
        sqlx::query(&format!("DROP DATABASE IF EXISTS {database}"))
            .execute(pool)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn tenant_databases_come_and_go_and_an_unmigrated_one_is_retried_alone() {
    let setup = pool().await;
    let prefix = support::unique_name("outbox_t_tn");
    let [a, b, c] = ["a", "b", "c"].map(|t| format!("{prefix}_{t}"));
    let (_, a_ids) = tenant(&setup, &a, true, 4).await;
    let (store_b, _) = tenant(&setup, &b, false, 0).await;
    // Holds no outbox: the pattern matches, the source does not list it.
    tenant(&setup, &format!("{prefix}_empty"), false, 0).await;
    let databases = MySqlDatabaseTenants::new(setup.clone(), format!("{prefix}\\_%"));
    let listed: Vec<String> = databases
        .tenants()
        .await
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(
        listed,
        std::slice::from_ref(&a),
        "databases holding an outbox"
    );

    // The tenants table lists b before its tables exist.
    let registry = format!("{prefix}_registry");
    sqlx::query(&format!("CREATE DATABASE {registry}"))
        .execute(&setup)
        .await
        .unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {registry}.tenants (name VARCHAR(64) PRIMARY KEY)"
    ))
    .execute(&setup)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {registry}.tenants VALUES ('{a}'), ('{b}')"
    ))
    .execute(&setup)
    .await
    .unwrap();
    let query = MySqlQueryTenants::new(
        setup.clone(),
        format!("SELECT name FROM {registry}.tenants"),
    );
    let publishers = Publishers::default();
    let (fleet, shutdown) = fleet(query, publishers.relays(&setup));
    let status = fleet.status();
    let running = tokio::spawn(fleet.run(shutdown.clone()));

    until("a publishes while b is unmigrated", || {
        publishers.published(&a) == a_ids
    })
    .await;
    let b_id = TenantId::new(b.clone()).unwrap();
    until("b is reported retrying", || {
        matches!(
            status.tenant(&b_id).map(|s| s.state),
            Some(TenantState::Retrying { .. })
        )
    })
    .await;
    store_b.migrate().await.unwrap();
    let b_event = event("k", 0);
    OutboxWriter::enqueue(&store_b, std::slice::from_ref(&b_event))
        .await
        .unwrap();
    until("b publishes once migrated", || {
        publishers.published(&b).contains(&b_event.event_id)
    })
    .await;

    // c joins the table; a leaves it.
    let (_, c_ids) = tenant(&setup, &c, true, 2).await;
    sqlx::query(&format!("INSERT INTO {registry}.tenants VALUES ('{c}')"))
        .execute(&setup)
        .await
        .unwrap();
    sqlx::query(&format!(
        "DELETE FROM {registry}.tenants WHERE name = '{a}'"
    ))
    .execute(&setup)
    .await
    .unwrap();
    until("c, added while running, publishes", || {
        publishers.published(&c) == c_ids
    })
    .await;
    let a_id = TenantId::new(a.clone()).unwrap();
    until("a, removed, is forgotten", || {
        status.tenant(&a_id).is_none()
    })
    .await;

    shutdown.cancel();
    let report = running.await.unwrap();
    assert_eq!(report.total().published, 4 + 1 + 2, "{report:?}");
    drop_databases(&setup, &[&a, &b, &c, &format!("{prefix}_empty"), &registry]).await;
}

/// A tenant database whose tables an older build made is reported and
/// retried on its own, never relayed on them; once upgraded it publishes.
#[tokio::test]
async fn a_tenant_database_at_an_older_schema_version_is_retried_alone() {
    let setup = pool().await;
    let prefix = support::unique_name("outbox_t_old");
    let [current, old] = ["current", "old"].map(|t| format!("{prefix}_{t}"));
    let (current_store, current_ids) = tenant(&setup, &current, true, 3).await;
    let (old_store, _) = tenant(&setup, &old, true, 0).await;
    let set_version = |delta: i32| {
        format!("UPDATE {old}.outbox_schema_version SET version = version + ({delta})")
    };
    sqlx::query(&set_version(-1)).execute(&setup).await.unwrap();
    let old_event = event("k", 0);
    OutboxWriter::enqueue(&old_store, std::slice::from_ref(&old_event))
        .await
        .unwrap();
    let publishers = Publishers::default();
    let (fleet, shutdown) = fleet(
        MySqlDatabaseTenants::new(setup.clone(), format!("{prefix}\\_%")),
        publishers.relays(&setup),
    );
    let status = fleet.status();
    let running = tokio::spawn(fleet.run(shutdown.clone()));

    let old_id = TenantId::new(old.clone()).unwrap();
    until("the older tenant is reported, retried", || {
        matches!(
            status.tenant(&old_id).map(|s| s.state),
            Some(TenantState::Retrying { ref error, failures, .. })
                if error.contains("schema version") && failures >= 2
        )
    })
    .await;
    until("the current tenant publishes meanwhile", || {
        publishers.published(&current) == current_ids
    })
    .await;
    assert!(
        publishers.published(&old).is_empty(),
        "nothing relayed on an older schema's tables"
    );
    sqlx::query(&set_version(1)).execute(&setup).await.unwrap();
    until("the upgraded tenant publishes", || {
        publishers.published(&old).contains(&old_event.event_id)
    })
    .await;
    let more = event("k", 9);
    OutboxWriter::enqueue(&current_store, std::slice::from_ref(&more))
        .await
        .unwrap();
    until("the current tenant still publishes", || {
        publishers.published(&current).contains(&more.event_id)
    })
    .await;

    shutdown.cancel();
    let report = running.await.unwrap();
    assert!(report.failures >= 2, "{report:?}");
    assert_eq!(report.total().published, 3 + 1 + 1, "{report:?}");
    drop_databases(&setup, &[&current, &old]).await;
}

#[tokio::test]
async fn ten_tenant_databases_share_a_pool_of_three_connections() {
    let setup = pool().await;
    let prefix = support::unique_name("outbox_t_tn");
    let databases: Vec<String> = (0..10).map(|n| format!("{prefix}_{n}")).collect();
    let mut written = HashMap::new();
    for database in &databases {
        written.insert(database.clone(), tenant(&setup, database, true, 15).await.1);
    }
    let fleet_pool = MySqlPoolOptions::new()
        .max_connections(3)
        .connect(&url())
        .await
        .unwrap();
    let publishers = Publishers::default();
    let source = MySqlDatabaseTenants::new(setup.clone(), format!("{prefix}\\_%"));
    let (fleet, shutdown) = fleet(source, publishers.relays(&fleet_pool));
    let running = tokio::spawn(fleet.run(shutdown.clone()));
    until("every tenant's events are published", || {
        written
            .iter()
            .all(|(database, ids)| &publishers.published(database) == ids)
    })
    .await;
    assert!(fleet_pool.size() <= 3, "the fleet stays within its pool");
    shutdown.cancel();
    let report = running.await.unwrap();
    assert_eq!(report.total().published, 150);
    assert_eq!(report.failures, 0);
    let names: Vec<&str> = databases.iter().map(String::as_str).collect();
    drop_databases(&setup, &names).await;
}

#[tokio::test]
async fn tenants_by_url_share_their_servers_pool_and_a_wrong_password_fails_alone() {
    const WRONG: &str = "wrong-pw-5517";
    let setup = pool().await;
    let prefix = support::unique_name("outbox_t_url");
    let [a, b, c, registry] = ["a", "b", "c", "registry"].map(|t| format!("{prefix}_{t}"));
    let (_, a_ids) = tenant(&setup, &a, true, 3).await;
    let (_, b_ids) = tenant(&setup, &b, true, 2).await;
    let (_, c_ids) = tenant(&setup, &c, true, 2).await;
    let server = url();
    let wrong_server = server.replacen("://root@", &format!("://root:{WRONG}@"), 1);
    assert!(wrong_server.contains(WRONG), "{server} logs in as root");
    sqlx::query(&format!("CREATE DATABASE {registry}"))
        .execute(&setup)
        .await
        .unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {registry}.tenants (id VARCHAR(64) PRIMARY KEY, url TEXT NOT NULL)"
    ))
    .execute(&setup)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {registry}.tenants VALUES ('a', ?), ('b', ?), ('c', ?)"
    ))
    .bind(format!("{server}/{a}"))
    .bind(format!("{server}/{b}"))
    .bind(format!("{wrong_server}/{c}"))
    .execute(&setup)
    .await
    .unwrap();
    let source = MySqlUrlTenants::new(
        setup.clone(),
        format!("SELECT id, url FROM {registry}.tenants"),
    );
    let stores = UrlTenantStores::new(source.urls(), |url| {
        MySqlTenantStores::lazy(url, 2, StoreConfig::default())
    });
    let publishers = Publishers::default();
    let relays = {
        let publishers = publishers.clone();
        let relay = RelayConfig {
            relay_id: RelayId::new("fleet"),
            poll_interval: Duration::from_millis(20),
            ..RelayConfig::default()
        };
        TenantRelays::new(stores.clone(), relay, move |t| publishers.of(t.as_str()))
    };
    let fleet = TenantFleet::new(source, relays, quick_fleet());
    let status = fleet.status();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(fleet.run(shutdown.clone()));

    until("the tenants with good URLs publish", || {
        publishers.published("a") == a_ids && publishers.published("b") == b_ids
    })
    .await;
    let c_id = TenantId::new("c").unwrap();
    until(
        "the tenant with a wrong password is reported, retried",
        || {
            matches!(
                status.tenant(&c_id).map(|s| s.state),
                Some(TenantState::Retrying { ref error, failures, .. })
                    if error.contains("Access denied") && !error.contains(WRONG) && failures >= 2
            )
        },
    )
    .await;
    assert!(publishers.published("c").is_empty());
    // a and b share their server's pool; c's login is another.
    let servers = stores.servers();
    assert_eq!(servers.len(), 2, "{servers:?}");
    assert!(!servers.iter().any(|s| s.contains(WRONG)), "{servers:?}");

    sqlx::query(&format!(
        "UPDATE {registry}.tenants SET url = ? WHERE id = 'c'"
    ))
    .bind(format!("{server}/{c}"))
    .execute(&setup)
    .await
    .unwrap();
    until("c, its password corrected, publishes", || {
        publishers.published("c") == c_ids
    })
    .await;
    shutdown.cancel();
    let report = running.await.unwrap();
    assert_eq!(report.total().published, 7, "{report:?}");
    drop_databases(&setup, &[&a, &b, &c, &registry]).await;
}
