//! The dashboard through a database restart: while PostgreSQL is down the
//! overview still answers with the last counts read and says since when
//! and why the store cannot be read; the failed list answers 503 with the
//! reason; once the server is back the next sample (on schedule, not
//! spaced out by the failed reads) shows the new counts. A private server,
//! so the shared one is never stopped.

use std::time::Duration;

use outbox_core::OutboxWriter;
use outbox_sql::testing::PrivatePg;
use outbox_sqlx::StoreConfig;
use outbox_sqlx::postgres::PgStore;
use serde_json::json;

use super::{dashboard, event, http_to};

/// The claimable count the overview shows for `event_type`, if it shows one.
fn claimable(page: &str, event_type: &str) -> Option<u64> {
    let marker = format!(r#"data-type="{event_type}" data-state="claimable">"#);
    let rest = &page[page.find(&marker)? + marker.len()..];
    rest.split('<').next()?.parse().ok()
}

async fn enqueue(store: &PgStore, n: usize) {
    let events = (0..n)
        .map(|i| event("invoice.paid", &format!("acct-{i}"), json!({ "n": i })))
        .collect::<Vec<_>>();
    OutboxWriter::enqueue(store, &events).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_rides_out_a_database_restart() {
    let server = tokio::task::spawn_blocking(|| PrivatePg::start(&[]))
        .await
        .unwrap();
    server.psql("postgres", "CREATE DATABASE outbox");
    let url = server.url("outbox");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap();
    let store = PgStore::new(pool.clone(), StoreConfig::default());
    store.migrate().await.unwrap();
    enqueue(&store, 3).await;
    let (_dashboard, address) = dashboard(&url, None).await;
    let (status, page) = http_to(&address, "/", "", "").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(claimable(&page, "invoice.paid"), Some(3), "{page}");
    pool.close().await;

    let server = tokio::task::spawn_blocking(move || {
        server.stop();
        server
    })
    .await
    .unwrap();
    // The next samples fail: the overview keeps the last counts and says why.
    let page = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let (status, page) = http_to(&address, "/", "", "").await;
            assert_eq!(status, 200, "the last counts are still shown: {page}");
            if page.contains(r#"id="store-unreadable""#) {
                return page;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the overview says the store cannot be read");
    assert_eq!(claimable(&page, "invoice.paid"), Some(3), "{page}");
    assert!(!page.contains("postgres://"), "no URL on the page: {page}");
    let (status, body) = http_to(&address, "/failed", "", "").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("could not answer"), "{body}");

    let server = tokio::task::spawn_blocking(move || {
        server.resume();
        server
    })
    .await
    .unwrap();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let store = PgStore::new(pool.clone(), StoreConfig::default());
    enqueue(&store, 2).await;
    // Within a few sample periods (one second each here), not after a
    // pause grown by the failed reads' timeouts.
    let last = std::sync::Mutex::new(String::new());
    let recovered = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let (_, page) = http_to(&address, "/", "", "").await;
            *last.lock().unwrap() = page.clone();
            if claimable(&page, "invoice.paid") == Some(5)
                && !page.contains(r#"id="store-unreadable""#)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        recovered.is_ok(),
        "the overview shows the new counts once the server is back: {}",
        last.lock().unwrap()
    );
    pool.close().await;
    drop(server);
}
