//! The dashboard in a real browser (headless Chromium over WebDriver): its
//! numbers are the store's, markup from the database stays text, actions
//! need the token and the CSRF token, and an operator's requeue, single and
//! bulk by filter, is published and kept in the history with their name.
//! Screenshots of the overview and an event's page land in
//! `target/screenshots/`; `stores` compares the overview with `outbox
//! status` on PostgreSQL and MariaDB; `restart` takes a private
//! PostgreSQL away under it and back; `tenants` is the daemon's tenant
//! picker.

mod browser;
mod restart;
mod stores;
mod tenants;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use browser::{Browser, http};
use outbox_core::store::{AttemptKind, EventState, OutboxAdmin};
use outbox_core::testing::RelayFleet;
use outbox_core::{
    EventId, NewEvent, OutboxWriter, PublishError, PublishOutcome, Publisher, StoredEvent,
    async_trait,
};
use outbox_sqlx::StoreConfig;
use outbox_sqlx::sqlite::SqliteStore;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

const TOKEN: &str = "dashboard-test-token-0123456789";
/// Markup an attacker could put in a payload or an error text.
const MARKUP: &str =
    r#"<script>document.title='pwned'</script><img src=x onerror="document.title='pwned'">"#;

/// Refuses (permanently, with markup in the error text) the events whose
/// payload says `"refuse": true`, until healed; delivers the rest.
#[derive(Default)]
struct Refusing {
    healed: AtomicBool,
    delivered: Mutex<HashSet<EventId>>,
}

#[async_trait]
impl Publisher for Refusing {
    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        batch
            .iter()
            .map(|stored| {
                let payload: serde_json::Value =
                    serde_json::from_str(stored.event.payload.as_str()).unwrap();
                let refuse = payload["refuse"] == true;
                if refuse && !self.healed.load(Ordering::SeqCst) {
                    return Err(PublishError::permanent(format!("schema mismatch {MARKUP}")));
                }
                self.delivered.lock().unwrap().insert(stored.event.event_id);
                Ok(())
            })
            .collect()
    }
}

impl Refusing {
    async fn wait_for(&self, ids: &[EventId]) {
        tokio::time::timeout(Duration::from_secs(30), async {
            while !ids
                .iter()
                .all(|id| self.delivered.lock().unwrap().contains(id))
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the requeued events are published");
    }
}

fn event(event_type: &str, key: &str, payload: serde_json::Value) -> NewEvent {
    NewEvent::builder(event_type, "account", key)
        .event_id(EventId::random())
        .partition_key(key)
        .payload(&payload)
        .build()
        .unwrap()
}

/// Starts `outbox dashboard` on a free port; its address.
async fn dashboard(url: &str, token: Option<&str>) -> (tokio::process::Child, String) {
    dashboard_with(url, &[], token).await
}

/// [`dashboard`] with more global arguments (`--schema …`).
async fn dashboard_with(
    url: &str,
    global: &[&str],
    token: Option<&str>,
) -> (tokio::process::Child, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
    command
        .args(global)
        .args([
            "--url",
            url,
            "dashboard",
            "--listen",
            "127.0.0.1:0",
            "--sample-every",
            "1s",
        ])
        .env_remove("OUTBOX_DASHBOARD_TOKEN")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(token) = token {
        command.env("OUTBOX_DASHBOARD_TOKEN", token);
    }
    let mut child = command.spawn().expect("the binary runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines
        .next_line()
        .await
        .unwrap()
        .expect("it says where it listens");
    let address = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_owned();
    (child, address)
}

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reads_and_repairs_failed_events_in_a_real_browser() {
    let dir = std::env::temp_dir().join(format!("outbox-dashboard-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("outbox.db");
    let url = format!("sqlite:{}", path.display());
    let store = Arc::new(
        SqliteStore::open(&path.to_string_lossy(), StoreConfig::default())
            .await
            .unwrap(),
    );
    store.migrate().await.unwrap();
    let poison = event(
        "invoice.paid",
        "acct-7",
        json!({"refuse": true, "note": MARKUP}),
    );
    let fine = (0..3).map(|i| event("invoice.paid", &format!("acct-{i}"), json!({"n": i})));
    let shipped = (0..3)
        .map(|i| {
            event(
                "order.shipped",
                &format!("order-{i}"),
                json!({"refuse": true, "n": i}),
            )
        })
        .collect::<Vec<_>>();
    let refunds = (0..60)
        .map(|i| {
            event(
                "refund.issued",
                &format!("refund-{i}"),
                json!({"refuse": true, "n": i}),
            )
        })
        .collect::<Vec<_>>();
    let mut events = vec![poison.clone()];
    events.extend(fine);
    events.extend(shipped.iter().cloned());
    events.extend(refunds.iter().cloned());
    OutboxWriter::enqueue(&*store, &events).await.unwrap();
    let publisher = Arc::new(Refusing::default());
    let relays = RelayFleet::spawn_with(store.clone(), publisher.clone(), "browser", 1, |_| {});
    tokio::time::timeout(Duration::from_secs(30), async {
        while store
            .stats()
            .await
            .unwrap()
            .iter()
            .map(|s| s.failed)
            .sum::<u64>()
            < 4
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("64 events fail");

    let (_server, address) = dashboard(&url, Some(TOKEN)).await;
    let base = format!("http://{address}");
    let browser = Browser::start().await;

    // The overview's numbers are the store's.
    // Until the sampler (every second here) has read three times, the
    // charts have fewer points: reload until every line chart draws two or
    // more (the published chart's first point needs two samples).
    let points = "return [...document.querySelectorAll('svg.chart polyline')].map(p => p.getAttribute('points').split(' ').length);";
    let drawn = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            browser.goto(&format!("{base}/")).await;
            let drawn = browser.run(points).await;
            let lines = drawn.as_array().unwrap();
            if lines.len() == 3 && lines.iter().all(|n| n.as_u64().unwrap() >= 2) {
                return drawn;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("every line chart draws its samples");
    assert_eq!(drawn.as_array().unwrap().len(), 3, "{drawn}");
    let shown = browser
        .run("return [...document.querySelectorAll('[data-state]')].map(e => [e.dataset.type, e.dataset.state, Number(e.textContent)]);")
        .await;
    let mut expected = Vec::new();
    for s in store.stats().await.unwrap() {
        for (state, n) in s.counts() {
            expected.push(json!([s.event_type, state, n]));
        }
    }
    assert_eq!(shown, json!(expected));
    assert!(
        browser.text("#relays").await.contains("browser"),
        "the relay is listed"
    );

    // Failed events page 50 at a time, by keyset.
    browser
        .goto(&format!("{base}/failed?type=refund.issued"))
        .await;
    assert_eq!(
        browser
            .run("return document.querySelectorAll('#failed tbody tr').length;")
            .await,
        50
    );
    browser.click("#next-page").await;
    browser
        .wait_for("a[href^='/failed?type=refund.issued']")
        .await;
    let second = browser
        .run("return [...document.querySelectorAll('#failed tbody tr td:nth-child(3)')].map(td => td.textContent);")
        .await;
    let keys = (50..60).map(|i| format!("refund-{i}")).collect::<Vec<_>>();
    assert_eq!(
        second,
        json!(keys),
        "the second page holds the last ten, in order"
    );

    // The poison event's page: payload and error text shown as text.
    browser
        .goto(&format!("{base}/failed?type=invoice.paid"))
        .await;
    assert_eq!(
        browser
            .run("return document.getElementById('matching').dataset.count;")
            .await,
        "1"
    );
    browser
        .click(&format!("a[href='/events/{}']", poison.event_id))
        .await;
    browser.wait_for("#show-payload").await;
    browser.click("#show-payload").await;
    browser.wait_for("#payload").await;
    assert!(
        browser
            .text("#payload")
            .await
            .contains("<script>document.title='pwned'</script>")
    );
    assert!(browser.text("#history").await.contains("onerror="));
    let executed = browser
        .run("return [document.title, document.querySelectorAll('main script, main img').length];")
        .await;
    assert_eq!(
        executed,
        json!([format!("Event {} · outbox", poison.event_id), 0])
    );
    assert!(browser.text("#actions").await.contains("Sign in"));
    browser
        .screenshot(&screenshots().join("dashboard-event.png"))
        .await;

    // Actions are refused without a session, and with one but no CSRF token.
    let requeue = format!("/events/{}/requeue", poison.event_id);
    let form = "content-type: application/x-www-form-urlencoded\r\n";
    let (status, _) = http_to(&address, &requeue, form, "operator=mallory&reason=x").await;
    assert_eq!(status, 403);
    browser.goto(&format!("{base}/login")).await;
    browser.type_into("#login input[name=token]", TOKEN).await;
    browser.click("#login button").await;
    browser.wait_for("form[action='/logout']").await;
    let cookie = browser.cookies().await;
    assert!(cookie.contains("outbox_session="), "{cookie}");
    let with_cookie = format!("{form}cookie: {cookie}\r\n");
    let (status, body) = http_to(
        &address,
        &requeue,
        &with_cookie,
        "operator=mallory&reason=x",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("CSRF"));
    let (status, _) = http_to(
        &address,
        &requeue,
        &with_cookie,
        "operator=mallory&reason=x&csrf=forged",
    )
    .await;
    assert_eq!(status, 403);
    assert!(matches!(
        store.event_state(poison.event_id).await.unwrap(),
        Some(EventState::Failed { .. })
    ));

    // Requeued from its page with a reason: published, and the history says who.
    publisher.healed.store(true, Ordering::SeqCst);
    browser
        .goto(&format!("{base}/events/{}", poison.event_id))
        .await;
    browser
        .type_into("#requeue input[name=operator]", "alice")
        .await;
    browser
        .type_into("#requeue input[name=reason]", "consumer schema fixed")
        .await;
    browser.click("#requeue button").await;
    publisher.wait_for(&[poison.event_id]).await;
    browser
        .goto(&format!("{base}/events/{}", poison.event_id))
        .await;
    let history = browser.text("#history").await;
    assert!(
        history.contains("alice") && history.contains("consumer schema fixed"),
        "{history}"
    );

    // Supersede from its page: a new payload takes its place and goes out.
    let replaced = refunds[0].event_id;
    browser.goto(&format!("{base}/events/{replaced}")).await;
    browser
        .type_into("#supersede input[name=operator]", "carol")
        .await;
    browser
        .type_into("#supersede input[name=reason]", "amount corrected")
        .await;
    browser.clear("#supersede textarea").await;
    browser
        .type_into("#supersede textarea", r#"{"n": 0, "amount": 12}"#)
        .await;
    browser.click("#supersede button").await;
    let by = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(EventState::Failed {
                superseded_by: Some(by),
                ..
            }) = store.event_state(replaced).await.unwrap()
            {
                return by;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("superseded, and linked to its replacement");
    publisher.wait_for(&[by]).await;
    let last = store.history(replaced).await.unwrap().pop().unwrap();
    assert_eq!(
        (last.kind, last.actor.as_str()),
        (AttemptKind::Superseded, "carol")
    );

    // Skip from its page: it stays failed, the skip in its history.
    let skipped = refunds[1].event_id;
    browser.goto(&format!("{base}/events/{skipped}")).await;
    browser
        .type_into("#skip input[name=operator]", "dave")
        .await;
    browser
        .type_into("#skip input[name=reason]", "refund cancelled")
        .await;
    browser.click("#skip button").await;
    tokio::time::timeout(Duration::from_secs(10), async {
        while store.history(skipped).await.unwrap().last().unwrap().kind != AttemptKind::Skipped {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the skip is kept in the history");
    browser.goto(&format!("{base}/events/{skipped}")).await;
    assert!(browser.text("#history").await.contains("dave"));

    // Bulk requeue by filter: a count, a confirmation, then all of them.
    browser
        .goto(&format!("{base}/failed?type=order.shipped"))
        .await;
    assert_eq!(
        browser
            .run("return document.getElementById('matching').dataset.count;")
            .await,
        "3"
    );
    browser.type_into("#bulk input[name=operator]", "bob").await;
    browser
        .type_into("#bulk input[name=reason]", "broker topic recreated")
        .await;
    browser.click("#bulk button[value=requeue]").await;
    browser.wait_for("#confirm-count").await;
    assert_eq!(
        browser
            .run("return document.getElementById('confirm-count').dataset.count;")
            .await,
        "3"
    );
    assert!(
        store.stats().await.unwrap().iter().any(|s| s.failed == 3),
        "nothing happens before the confirmation"
    );
    // One more fails after the count: the confirmed action leaves it alone.
    publisher.healed.store(false, Ordering::SeqCst);
    let late = event("order.shipped", "order-late", json!({"refuse": true}));
    OutboxWriter::enqueue(&*store, std::slice::from_ref(&late))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        while !matches!(
            store.event_state(late.event_id).await.unwrap(),
            Some(EventState::Failed { .. })
        ) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the late event fails");
    publisher.healed.store(true, Ordering::SeqCst);
    browser.click("#confirm button").await;
    browser
        .wait_for("#bulk-progress[data-state=finished]")
        .await;
    assert_eq!(
        browser
            .run("return document.getElementById('bulk-progress').dataset.done;")
            .await,
        "3"
    );
    assert!(
        matches!(
            store.event_state(late.event_id).await.unwrap(),
            Some(EventState::Failed { .. })
        ),
        "failed after the count: not requeued"
    );
    let ids = shipped.iter().map(|e| e.event_id).collect::<Vec<_>>();
    publisher.wait_for(&ids).await;
    let last = store.history(ids[2]).await.unwrap().pop().unwrap();
    assert_eq!(last.actor, "bob");

    // What the operator repaired went out: the published chart rises.
    let peak = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            browser.goto(&format!("{base}/")).await;
            let label = browser
                .run("return document.querySelector('#chart-published text').textContent;")
                .await;
            if label != "0 events/s" {
                return label;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .expect("the published chart shows the requeued events going out");
    assert!(peak.as_str().unwrap().ends_with(" events/s"), "{peak}");
    browser
        .screenshot(&screenshots().join("dashboard-overview.png"))
        .await;
    relays.stop(Duration::from_secs(30)).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A read-only dashboard (no token) offers no sign-in and refuses actions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_dashboard_is_read_only() {
    let dir = std::env::temp_dir().join(format!("outbox-dashboard-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("outbox.db");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path.to_string_lossy(), StoreConfig::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let (_server, address) = dashboard(&url, None).await;
    let (status, body) = http_to(&address, "/", "", "").await;
    assert_eq!(status, 200);
    // Listening on loopback, it answers loopback names only (DNS rebinding).
    for host in ["localhost:1", "[::1]:1"] {
        let named = format!("host: {host}\r\n");
        assert_eq!(http_to(&address, "/", &named, "").await.0, 200, "{host}");
    }
    let rebound = http_to(&address, "/", "host: attacker.example:80\r\n", "").await;
    assert_eq!(rebound.0, 421, "{}", rebound.1);
    assert!(
        body.contains("read-only") && !body.contains("/login\""),
        "{body}"
    );
    let form = "content-type: application/x-www-form-urlencoded\r\n";
    let (status, body) = http_to(&address, "/login", form, "token=anything").await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("set-cookie"));
    let (status, body) = http_to(
        &address,
        &format!("/events/{}/requeue", EventId::random()),
        form,
        "operator=a&reason=b",
    )
    .await;
    assert_eq!(status, 403);
    assert!(body.contains("read-only"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A request to the dashboard at `address`: POST when `body` is not empty.
async fn http_to(address: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    let port = address.rsplit(':').next().unwrap().parse().unwrap();
    let method = if body.is_empty() { "GET" } else { "POST" };
    http(port, method, path, headers, Some(body.to_owned())).await
}
