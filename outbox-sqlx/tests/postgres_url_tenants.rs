//! Tenants spread over servers and databases, each tenant's row naming the
//! URL of its outbox (issue 36): tenants of one database share one pool, a
//! tenant whose credentials are wrong is reported and retried on its own
//! (its password shown nowhere) while the others flow, and runs once its
//! row is corrected.
#![cfg(feature = "postgres")]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::memory::RecordingPublisher;
use outbox_core::tenants::{TenantFleet, TenantId, TenantState};
use outbox_core::testing::event;
use outbox_core::{CancellationToken, EventId, OutboxWriter, RelayConfig, RelayId};
use outbox_sql::testing::PrivatePg;
use outbox_sqlx::postgres::{PgStore, PgTenantStores, PgUrlTenants};
use outbox_sqlx::tenants::{TenantRelays, UrlTenantStores};
use outbox_sqlx::{StoreConfig, TableNames};
use sqlx::PgPool;
use support::pg::{connect, shared_url};
use support::tenants::{quick_fleet, until};

/// The private server's password, and the wrong one a tenant's row gives.
const RIGHT: &str = "right-pw-4821";
const WRONG: &str = "wrong-pw-9375";

/// A private server where `postgres` logs in freely and every other role
/// needs its password.
fn server_with_passwords() -> (PrivatePg, std::path::PathBuf) {
    let hba = std::env::temp_dir().join(format!("{}.hba", support::unique_name("outbox")));
    std::fs::write(
        &hba,
        "local all all trust\n\
         host all postgres 127.0.0.1/32 trust\n\
         host all all 127.0.0.1/32 scram-sha-256\n",
    )
    .unwrap();
    let server = PrivatePg::start(&[&format!("hba_file = '{}'", hba.display())]);
    server.psql(
        "postgres",
        &format!("CREATE ROLE tenant_app LOGIN PASSWORD '{RIGHT}'"),
    );
    for database in ["acme", "globex"] {
        server.psql(
            "postgres",
            &format!("CREATE DATABASE {database} OWNER tenant_app"),
        );
    }
    (server, hba)
}

fn app_url(server: &PrivatePg, password: &str, database: &str) -> String {
    format!(
        "postgres://tenant_app:{password}@127.0.0.1:{}/{database}",
        server.port()
    )
}

/// A migrated store at `url` (in `schema`, if given), holding one event.
async fn tenant_with_an_event(pool: &PgPool, schema: Option<&str>) -> (PgStore, EventId) {
    let mut tables = TableNames::default();
    if let Some(schema) = schema {
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(pool)
            .await
            .unwrap();
        tables = tables.in_schema(schema).unwrap();
    }
    let store = PgStore::new(pool.clone(), StoreConfig::with_tables(tables));
    store.migrate().await.unwrap();
    let id = enqueue(&store).await;
    (store, id)
}

async fn enqueue(store: &PgStore) -> EventId {
    let event = event("k", 0);
    let id = event.event_id;
    OutboxWriter::enqueue(store, &[event]).await.unwrap();
    id
}

#[tokio::test]
async fn tenants_by_url_share_a_pool_per_database_and_wrong_credentials_fail_alone() {
    let (server, hba) = server_with_passwords();
    let shared = connect(&shared_url()).await;
    let prefix = support::unique_name("urlt");
    let [a, b, registry] = ["a", "b", "registry"].map(|t| format!("{prefix}_{t}"));
    // Two tenants in schemas of the shared database, two in databases of
    // their own on the private server.
    let (_, a1) = tenant_with_an_event(&shared, Some(&a)).await;
    let (_, b1) = tenant_with_an_event(&shared, Some(&b)).await;
    let acme = connect(&app_url(&server, RIGHT, "acme")).await;
    let (_, c1) = tenant_with_an_event(&acme, None).await;
    let globex = connect(&app_url(&server, RIGHT, "globex")).await;
    let (_, d1) = tenant_with_an_event(&globex, None).await;
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA {registry};
         CREATE TABLE {registry}.tenants (id text PRIMARY KEY, url text NOT NULL, schema_name text);
         INSERT INTO {registry}.tenants VALUES
           ('a', '{shared}', '{a}'), ('b', '{shared}', '{b}'),
           ('c', '{acme}', NULL), ('d', '{globex}', NULL)",
        shared = shared_url(),
        acme = app_url(&server, RIGHT, "acme"),
        globex = app_url(&server, WRONG, "globex"),
    ))
    .execute(&shared)
    .await
    .unwrap();

    let publishers: Arc<Mutex<HashMap<TenantId, Arc<RecordingPublisher>>>> = Arc::default();
    let source = PgUrlTenants::new(
        shared.clone(),
        format!("SELECT id, url, schema_name FROM {registry}.tenants"),
    );
    let stores = UrlTenantStores::new(source.urls(), |url| {
        PgTenantStores::lazy(url, 2, StoreConfig::default())
    });
    let relay = RelayConfig {
        relay_id: RelayId::new("fleet"),
        poll_interval: Duration::from_millis(20),
        ..RelayConfig::default()
    };
    let relays = {
        let publishers = publishers.clone();
        TenantRelays::new(stores.clone(), relay, move |t| {
            publishers
                .lock()
                .unwrap()
                .entry(t.clone())
                .or_default()
                .clone()
        })
    };
    let fleet = TenantFleet::new(source, relays, quick_fleet());
    let status = fleet.status();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(fleet.run(shutdown.clone()));
    let published = |tenant: &str, id: EventId| {
        let publisher = publishers
            .lock()
            .unwrap()
            .get(&TenantId::new(tenant).unwrap())
            .cloned();
        publisher.is_some_and(|p| p.delivered_ids().contains(&id))
    };

    until("the tenants with good URLs publish", || {
        published("a", a1) && published("b", b1) && published("c", c1)
    })
    .await;
    let d = TenantId::new("d").unwrap();
    until(
        "the tenant with a wrong password is reported, retried",
        || {
            matches!(
                status.tenant(&d).map(|s| s.state),
                Some(TenantState::Retrying { ref error, failures, .. })
                    if error.contains("password authentication failed") && failures >= 2
            )
        },
    )
    .await;
    let Some(TenantState::Retrying { error, .. }) = status.tenant(&d).map(|s| s.state) else {
        unreachable!()
    };
    assert!(
        !error.contains(WRONG),
        "the password is not reported: {error}"
    );
    assert!(!published("d", d1));
    // The others go on meanwhile.
    let a_store = PgStore::new(
        shared.clone(),
        StoreConfig::with_tables(TableNames::default().in_schema(&a).unwrap()),
    );
    let a2 = enqueue(&a_store).await;
    until("a goes on while d fails", || published("a", a2)).await;
    // a and b share the shared database's pool; c and d have one each.
    let servers = stores.servers();
    assert_eq!(servers.len(), 3, "{servers:?}");
    assert!(
        !servers
            .iter()
            .any(|s| s.contains(WRONG) || s.contains(RIGHT)),
        "{servers:?}"
    );

    // Corrected, the row's URL applies at the tenant's next start.
    sqlx::query(&format!(
        "UPDATE {registry}.tenants SET url = $1 WHERE id = 'd'"
    ))
    .bind(app_url(&server, RIGHT, "globex"))
    .execute(&shared)
    .await
    .unwrap();
    until("d, its password corrected, publishes", || {
        published("d", d1)
    })
    .await;
    assert_eq!(
        status.tenant(&d).map(|s| s.state),
        Some(TenantState::Running)
    );

    shutdown.cancel();
    let report = running.await.unwrap();
    assert_eq!(report.total().published, 5, "{report:?}");
    assert!(report.failures >= 2, "{report:?}");
    for schema in [a, b, registry] {
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&shared)
            .await
            .unwrap();
    }
    drop(server);
    let _ = std::fs::remove_file(hba);
}

#[tokio::test]
async fn a_tenants_query_of_the_wrong_shape_is_refused_by_name() {
    use outbox_core::tenants::TenantSource;
    let shared = connect(&shared_url()).await;
    let one_column = PgUrlTenants::new(shared.clone(), "SELECT 'a'");
    let error = one_column.tenants().await.unwrap_err().to_string();
    assert!(
        error.contains("must return (tenant, url) or (tenant, url, schema)"),
        "{error}"
    );
    let twice = PgUrlTenants::new(
        shared.clone(),
        "SELECT 'a', 'postgres://x/y' UNION ALL SELECT 'a', 'postgres://x/z'",
    );
    let error = twice.tenants().await.unwrap_err().to_string();
    assert!(error.contains("lists tenant a twice"), "{error}");
    // A NULL tenant or URL is refused by name, not read as text.
    let null_url = PgUrlTenants::new(shared.clone(), "SELECT 'a', NULL::text");
    let error = null_url.tenants().await.unwrap_err().to_string();
    assert!(
        error.contains("returned NULL for a tenant or its URL"),
        "{error}"
    );
    let null_tenant = outbox_sqlx::tenants::QueryTenants::new(shared.clone(), "SELECT NULL::text");
    let error = null_tenant.tenants().await.unwrap_err().to_string();
    assert!(error.contains("returned NULL for a tenant"), "{error}");
    // A URL that is no URL fails its tenant alone, at its start.
    let source = PgUrlTenants::new(shared, "SELECT 'a', 'not a url'");
    assert_eq!(source.tenants().await.unwrap().len(), 1);
    let stores = UrlTenantStores::new(source.urls(), |url| {
        PgTenantStores::lazy(url, 1, StoreConfig::default())
    });
    let error = outbox_sqlx::tenants::TenantStores::store(&stores, &TenantId::new("a").unwrap())
        .unwrap_err()
        .to_string();
    assert!(error.contains("tenant a's URL"), "{error}");
}
