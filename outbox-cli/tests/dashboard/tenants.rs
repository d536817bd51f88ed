//! The daemon's dashboard over a fleet's tenants, in a real browser: the
//! picker lists every tenant schema and its relay's state, opening one
//! shows that tenant's own counts (and names it), the way back leads to
//! the picker, and one sign-in serves every tenant.

use std::time::Duration;

use outbox_core::OutboxWriter;
use outbox_sqlx::postgres::PgStore;
use outbox_sqlx::{StoreConfig, TableNames};
use serde_json::json;

use super::browser::Browser;
use super::{TOKEN, event};

/// A tenant schema holding `n` events of `event_type` due in an hour
/// (parked: the relay leaves them, so the counts stay put).
async fn tenant(pool: &sqlx::PgPool, schema: &str, event_type: &str, n: usize) {
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(pool)
        .await
        .unwrap();
    let tables = TableNames::default().in_schema(schema).unwrap();
    let store = PgStore::new(pool.clone(), StoreConfig::with_tables(tables));
    store.migrate().await.unwrap();
    let later = outbox_core::chrono::Utc::now() + outbox_core::chrono::Duration::hours(1);
    let events: Vec<_> = (0..n)
        .map(|i| {
            let mut e = event(event_type, &format!("k{i}"), json!({ "n": i }));
            e.available_at = Some(later);
            e
        })
        .collect();
    OutboxWriter::enqueue(&store, &events).await.unwrap();
}

/// Starts `outbox relay` over every schema `LIKE pattern`, with the
/// dashboard at `/ui`; its child process and address.
async fn fleet_daemon(
    pg_url: &str,
    pattern: &str,
    config_dir: &std::path::Path,
) -> (tokio::process::Child, String) {
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .to_string();
    let redis =
        std::env::var("OUTBOX_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let config = config_dir.join("relay.toml");
    std::fs::write(
        &config,
        format!(
            "url = \"{pg_url}\"\n[tenants]\nschemas = \"{pattern}\"\nrefresh = \"200ms\"\n\
             [broker]\nkind = \"redis\"\nurl = \"{redis}\"\n\
             [http]\nlisten = \"{address}\"\ndashboard = \"/ui\"\n"
        ),
    )
    .unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["relay", "--config"])
        .arg(&config)
        .env("OUTBOX_DASHBOARD_TOKEN", TOKEN)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary runs");
    (child, address)
}

/// The count the overview shows for a type and state.
async fn shown(browser: &Browser, event_type: &str, state: &str) -> String {
    let css = format!("span[data-type='{event_type}'][data-state='{state}']");
    browser.wait_for(&css).await;
    browser.text(&css).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_picks_a_tenant_and_signs_in_once_for_every_tenant() {
    let pg_url = std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".into());
    let pool = sqlx::PgPool::connect(&pg_url).await.unwrap();
    let prefix = format!("ui_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let (a, b) = (format!("{prefix}_a"), format!("{prefix}_b"));
    tenant(&pool, &a, "invoice.paid", 2).await;
    tenant(&pool, &b, "order.shipped", 3).await;
    let dir = std::env::temp_dir().join(format!("outbox-ui-tenants-{prefix}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (_daemon, address) = fleet_daemon(&pg_url, &format!("{prefix}_%"), &dir).await;
    let base = format!("http://{address}/ui");
    let browser = Browser::start().await;

    // The picker lists both tenants once their relays run.
    let listed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            browser.goto(&format!("{base}/")).await;
            let rows = browser
                .run("return document.querySelectorAll('#tenants tbody tr').length;")
                .await;
            let running = browser
                .run("return [...document.querySelectorAll('#tenants tbody tr')].filter(r => r.cells[1].textContent === 'running').length;")
                .await;
            if rows == 2 && running == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(listed.is_ok(), "the picker lists both tenants, running");
    browser
        .screenshot(&super::screenshots().join("tenants.png"))
        .await;

    // Choosing b in the form opens b's dashboard, with b's counts.
    browser
        .run(&format!(
            "document.querySelector('#pick select').value = '{b}'; return true;"
        ))
        .await;
    browser.click("#pick button").await;
    browser.wait_for("#tenant").await;
    assert_eq!(browser.text("#tenant").await, b);
    assert_eq!(shown(&browser, "order.shipped", "parked").await, "3");
    let page = browser.run("return document.body.innerHTML;").await;
    assert!(
        !page.as_str().unwrap_or_default().contains("invoice.paid"),
        "b's page shows b's events only"
    );

    // Back to the picker, then a's link: a's counts.
    browser.click("#all-tenants").await;
    browser.wait_for("#tenants").await;
    browser
        .click(&format!("#tenants a[href='/ui/t/{a}/']"))
        .await;
    browser.wait_for("#tenant").await;
    assert_eq!(browser.text("#tenant").await, a);
    assert_eq!(shown(&browser, "invoice.paid", "parked").await, "2");
    browser
        .screenshot(&super::screenshots().join("tenant.png"))
        .await;

    // Signed in on a's dashboard, signed in on b's too.
    browser.goto(&format!("{base}/t/{a}/login")).await;
    browser.type_into("#login input[name=token]", TOKEN).await;
    browser.click("#login button").await;
    browser
        .wait_for(&format!("form[action='/ui/t/{a}/logout']"))
        .await;
    browser.goto(&format!("{base}/t/{b}/")).await;
    browser
        .wait_for(&format!("form[action='/ui/t/{b}/logout']"))
        .await;

    // A tenant that is not relayed here is a clear 404.
    browser.goto(&format!("{base}/t/{prefix}_nobody/")).await;
    browser.wait_for("#error").await;
    assert!(browser.text("#error").await.contains("No tenant"));

    for schema in [a, b] {
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&pool)
            .await
            .unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
