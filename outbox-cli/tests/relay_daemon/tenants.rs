//! `outbox relay` with `[tenants]`: every schema matching a pattern relayed
//! by one process, a schema created while it runs picked up at the next
//! refresh, `/health` per tenant, the relays' metrics and the backlog
//! gauges per tenant, the scheduled purge over every tenant, SIGTERM
//! drains them all; tenants named by URL, one on a server that is down
//! reported alone.

use outbox_core::OutboxWriter;
use outbox_core::testing::event;
use outbox_sqlx::postgres::PgStore;
use outbox_sqlx::{StoreConfig, TableNames};

use super::*;

async fn tenant(pool: &outbox_sqlx::sqlx::PgPool, schema: &str, events: usize) -> PgStore {
    outbox_sqlx::sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(pool)
        .await
        .unwrap();
    let tables = TableNames::default().in_schema(schema).unwrap();
    let store = PgStore::new(pool.clone(), StoreConfig::with_tables(tables));
    store.migrate().await.unwrap();
    let batch: Vec<_> = (0..events).map(|n| event(&format!("k{n}"), n)).collect();
    OutboxWriter::enqueue(&store, &batch).await.unwrap();
    store
}

/// A daemon over `url`'s tenants (`[tenants]` holding `tenants`, every
/// 200 ms), polling every 100 ms as `relay_id`, relaying to Redis streams
/// under `streams`, serving `/metrics` and `/health` on `listen`; `more`:
/// further sections.
fn fleet_config(
    url: &str,
    relay_id: &str,
    tenants: &str,
    more: &str,
    streams: &str,
    listen: &str,
) -> ConfigFile {
    ConfigFile::with(&format!(
        r#"
url = "{url}"

[relay]
id = "{relay_id}"
poll_interval = "100ms"

[tenants]
{tenants}
refresh = "200ms"

{more}

[broker]
kind = "redis"
url = "{redis}"
stream_prefix = "{streams}"

[http]
listen = "{listen}"
"#,
        redis = redis_url(),
    ))
}

async fn stream_len(redis: &mut redis::aio::MultiplexedConnection, stream: &str) -> usize {
    redis::cmd("XLEN")
        .arg(stream)
        .query_async(redis)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_daemon_relays_every_tenant_schema_and_picks_up_new_ones() {
    let pool = outbox_sqlx::sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg_url())
        .await
        .unwrap();
    let prefix = unique("tenants");
    let store_a = tenant(&pool, &format!("{prefix}_a"), 3).await;
    tenant(&pool, &format!("{prefix}_b"), 4).await;
    // Due in an hour: a backlog /metrics shows under the tenant's label.
    let mut later = event("later", 0);
    later.available_at = Some(chrono::Utc::now() + chrono::Duration::hours(1));
    OutboxWriter::enqueue(&store_a, &[later]).await.unwrap();
    let streams = format!("{}:", unique("tenants"));
    let stream = format!("{streams}invoice.paid");
    let listen = free_address();
    let config = fleet_config(
        &pg_url(),
        "fleet-test",
        &format!("schemas = \"{prefix}_%\"\nconnections = 3"),
        "[purge]\npublished_older_than = \"0s\"\nevery = \"200ms\"",
        &streams,
        &listen,
    );
    let child = spawn_daemon(&config);
    let client = redis::Client::open(redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();

    let published = |tenant: &str| {
        format!(
            r#"outbox_relay_published_total{{relay="fleet-test/{prefix}_{tenant}",tenant="{prefix}_{tenant}"}}"#
        )
    };
    scrape_until(&listen, |m| {
        gauge(m, &published("a")) == Some(3.0) && gauge(m, &published("b")) == Some(4.0)
    })
    .await;
    assert_eq!(stream_len(&mut redis, &stream).await, 7);
    let backlog = |tenant: &str, state: &str| {
        format!(
            r#"outbox_events{{event_type="invoice.paid",state="{state}",tenant="{prefix}_{tenant}"}}"#
        )
    };
    scrape_until(&listen, |m| {
        gauge(m, &backlog("a", "parked")) == Some(1.0)
            && gauge(m, &backlog("a", "claimable")) == Some(0.0)
    })
    .await;
    // [purge] goes over every tenant: only a's event due later is left.
    for (t, left) in [("a", 1), ("b", 0)] {
        let rows = format!("SELECT count(*) FROM {prefix}_{t}.outbox_events");
        let purged = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            loop {
                let n: i64 = outbox_sqlx::sqlx::query_scalar(&rows)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                if n == left {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(purged.is_ok(), "tenant {t}'s published events purged");
    }
    let (status, body) = get(&listen, "/health").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("ok: 2 of 2 tenants running"), "{body}");

    tenant(&pool, &format!("{prefix}_c"), 5).await;
    scrape_until(&listen, |m| gauge(m, &published("c")) == Some(5.0)).await;
    assert_eq!(stream_len(&mut redis, &stream).await, 12);
    let (_, body) = get(&listen, "/health").await;
    assert!(body.contains("ok: 3 of 3 tenants running"), "{body}");

    stop_with_sigterm(child).await;
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    for t in ["a", "b", "c"] {
        outbox_sqlx::sqlx::query(&format!("DROP SCHEMA {prefix}_{t} CASCADE"))
            .execute(&pool)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_daemon_relays_every_tenant_database_on_mariadb() {
    use outbox_sqlx::mysql::MySqlStore;
    let mysql =
        std::env::var("OUTBOX_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into());
    let pool = outbox_sqlx::sqlx::MySqlPool::connect(&mysql).await.unwrap();
    let prefix = unique("outbox_t_dtn");
    for (t, n) in [("a", 3), ("b", 4)] {
        let database = format!("{prefix}_{t}");
        outbox_sqlx::sqlx::query(&format!("CREATE DATABASE {database}"))
            .execute(&pool)
            .await
            .unwrap();
        let tables = TableNames::default().in_schema(&database).unwrap();
        let store = MySqlStore::new(pool.clone(), StoreConfig::with_tables(tables));
        store.migrate().await.unwrap();
        let batch: Vec<_> = (0..n).map(|i| event(&format!("k{i}"), i)).collect();
        OutboxWriter::enqueue(&store, &batch).await.unwrap();
    }
    let streams = format!("{}:", unique("tenants"));
    let listen = free_address();
    let config = fleet_config(
        &mysql,
        "fleet-my",
        &format!("schemas = \"{prefix}\\\\_%\"\nconnections = 2"),
        "",
        &streams,
        &listen,
    );
    let child = spawn_daemon(&config);
    let published = |tenant: &str| {
        format!(
            r#"outbox_relay_published_total{{relay="fleet-my/{prefix}_{tenant}",tenant="{prefix}_{tenant}"}}"#
        )
    };
    scrape_until(&listen, |m| {
        gauge(m, &published("a")) == Some(3.0) && gauge(m, &published("b")) == Some(4.0)
    })
    .await;
    let client = redis::Client::open(redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("{streams}invoice.paid");
    assert_eq!(stream_len(&mut redis, &stream).await, 7);
    let (_, body) = get(&listen, "/health").await;
    assert!(body.contains("ok: 2 of 2 tenants running"), "{body}");
    stop_with_sigterm(child).await;
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    for t in ["a", "b"] {
        outbox_sqlx::sqlx::query(&format!("DROP DATABASE {prefix}_{t}"))
            .execute(&pool)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_named_by_url_are_relayed_and_one_whose_server_is_down_is_reported_alone() {
    let pool = outbox_sqlx::sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg_url())
        .await
        .unwrap();
    let prefix = unique("urlt");
    tenant(&pool, &format!("{prefix}_a"), 3).await;
    tenant(&pool, &format!("{prefix}_b"), 2).await;
    let down = "postgres://postgres:hidden-pw-6310@127.0.0.1:1/gone";
    outbox_sqlx::sqlx::raw_sql(&format!(
        "CREATE TABLE {prefix}_tenants (id text, url text, schema_name text);
         INSERT INTO {prefix}_tenants VALUES
           ('a', '{url}', '{prefix}_a'), ('b', '{url}', '{prefix}_b'), ('down', '{down}', NULL)",
        url = pg_url(),
    ))
    .execute(&pool)
    .await
    .unwrap();
    let streams = format!("{}:", unique("tenants"));
    let listen = free_address();
    let config = fleet_config(
        &pg_url(),
        "fleet-url",
        &format!("urls = \"SELECT id, url, schema_name FROM {prefix}_tenants\"\nconnections = 2"),
        "",
        &streams,
        &listen,
    );
    let child = spawn_daemon(&config);
    let published = |tenant: &str| {
        format!(r#"outbox_relay_published_total{{relay="fleet-url/{tenant}",tenant="{tenant}"}}"#)
    };
    scrape_until(&listen, |m| {
        gauge(m, &published("a")) == Some(3.0) && gauge(m, &published("b")) == Some(2.0)
    })
    .await;
    // Its pool gives up connecting after TENANT_ACQUIRE_TIMEOUT (10 s).
    let reported = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            let (status, body) = get(&listen, "/health").await;
            if body.contains("degraded: tenant down: failed") {
                return (status, body);
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await;
    let (status, body) = reported.expect("the tenant whose server is down is reported");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    assert!(body.contains("ok: 2 of 3 tenants running"), "{body}");
    assert!(!body.contains("hidden-pw"), "{body}");
    stop_with_sigterm(child).await;
    let client = redis::Client::open(redis_url()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(format!("{streams}invoice.paid"))
        .query_async(&mut redis)
        .await
        .unwrap();
    outbox_sqlx::sqlx::raw_sql(&format!(
        "DROP SCHEMA {prefix}_a CASCADE; DROP SCHEMA {prefix}_b CASCADE; DROP TABLE {prefix}_tenants"
    ))
    .execute(&pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn tenants_settings_that_cannot_work_are_refused_by_name() {
    let postgres = pg_url();
    let exactly_one = "set exactly one of schemas, query, urls or list";
    for (url, settings, refused) in [
        (postgres.as_str(), "", exactly_one),
        (
            postgres.as_str(),
            "schemas = \"t_%\"\nlist = [\"a\"]",
            exactly_one,
        ),
        (
            postgres.as_str(),
            "urls = \"SELECT 1\"\nquery = \"SELECT 1\"",
            exactly_one,
        ),
        (
            postgres.as_str(),
            "schemas = \"t_%\"\nrefresh = \"0s\"",
            "tenants.refresh must be non-zero",
        ),
        (
            postgres.as_str(),
            "schemas = \"t_%\"\nconnections = 0",
            "tenants.connections must be at least 1",
        ),
        (
            postgres.as_str(),
            "schemas = \"t_%\"\nconnections = 1",
            "at least 2 with listen",
        ),
        (
            "sqlite::memory:",
            "schemas = \"t_%\"",
            "PostgreSQL (a schema per tenant) or MySQL/MariaDB",
        ),
        (
            "mysql://root@127.0.0.1:3306",
            "schemas = \"t_%\"\nlisten = true",
            "MySQL/MariaDB has no LISTEN/NOTIFY",
        ),
        (
            postgres.as_str(),
            "list = [\"two words\"]",
            "invalid tenant id",
        ),
        (
            postgres.as_str(),
            "schemas = \"t_%\"\nbacklog_rest = -1.0",
            "tenants.backlog_rest must be a finite number >= 0",
        ),
    ] {
        let config = ConfigFile::with(&format!(
            "url = \"{url}\"\n[tenants]\n{settings}\n[broker]\nkind = \"redis\"\nurl = \"{redis}\"\n",
            redis = redis_url(),
        ));
        let output = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            daemon_command()
                .args(["relay", "--config"])
                .arg(&config.0)
                .output(),
        )
        .await
        .expect("refused at start")
        .unwrap();
        let log = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{settings}: {log}");
        assert!(log.contains(refused), "{settings}: {log}");
    }
}
