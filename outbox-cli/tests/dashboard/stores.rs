//! The overview against `outbox status` on the two servers.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::store::OutboxAdmin;
use outbox_core::testing::RelayFleet;
use outbox_core::{EventId, OutboxWriter};
use outbox_sqlx::StoreConfig;
use serde_json::json;

use super::{Refusing, dashboard_with, event, http_to};

/// On PostgreSQL and MariaDB, with a key blocked behind a failed event and
/// events waiting behind it: the overview's counts are `outbox status`'s
/// and `stats()`'s, it says what holds publication back, and lists the
/// blocked key with its blocking event and the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_says_what_status_says_on_postgres_and_mariadb() {
    use outbox_sqlx::mysql::MySqlStore;
    use outbox_sqlx::postgres::EndToEndDb;

    let db = EndToEndDb::create("dashboard").await;
    let pg_url = std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".into());
    let poison = block_a_key(&db.store).await;
    overview_matches_status(&*db.store, &pg_url, &["--schema", &db.schema], poison).await;

    let mysql_url =
        std::env::var("OUTBOX_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into());
    let pool = sqlx::MySqlPool::connect(&mysql_url)
        .await
        .unwrap_or_else(|e| panic!("MySQL/MariaDB unreachable at {mysql_url}: {e}"));
    let database = format!(
        "outbox_t_dash_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&pool)
        .await
        .unwrap();
    let tables = outbox_sqlx::TableNames::default()
        .in_schema(&database)
        .unwrap();
    let store = Arc::new(MySqlStore::new(
        pool.clone(),
        StoreConfig::with_tables(tables),
    ));
    store.migrate().await.unwrap();
    let poison = block_a_key(&store).await;
    overview_matches_status(&*store, &mysql_url, &["--schema", &database], poison).await;
    sqlx::query(&format!("DROP DATABASE {database}"))
        .execute(&pool)
        .await
        .unwrap();
}

/// Enqueues three events on each of four keys, the first of key `acct-0`
/// refused; relays under `PoisonPolicy::Block` until that key is blocked
/// and the other keys drained; returns the refused event's id.
async fn block_a_key<S: outbox_core::testing::ConformingStore>(store: &Arc<S>) -> EventId {
    let mut events = Vec::new();
    for n in 0..3 {
        for key in 0..4 {
            let refuse = key == 0 && n == 0;
            events.push(event(
                "invoice.paid",
                &format!("acct-{key}"),
                json!({"refuse": refuse, "n": n}),
            ));
        }
    }
    OutboxWriter::enqueue(&**store, &events).await.unwrap();
    let publisher = Arc::new(Refusing::default());
    let relays = RelayFleet::spawn_with(store.clone(), publisher.clone(), "overview", 1, |c| {
        c.poison = outbox_core::PoisonPolicy::Block;
    });
    let others = events
        .iter()
        .filter(|e| !e.partition_key.ends_with("-0"))
        .map(|e| e.event_id)
        .collect::<Vec<_>>();
    publisher.wait_for(&others).await;
    tokio::time::timeout(Duration::from_secs(30), async {
        while store.blocked_keys().await.unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the refused event blocks its key");
    relays.stop(Duration::from_secs(30)).await;
    events[0].event_id
}

async fn overview_matches_status(
    store: &dyn OutboxAdmin,
    url: &str,
    global: &[&str],
    poison: EventId,
) {
    let (_server, address) = dashboard_with(url, global, None).await;
    let (status, page) = http_to(&address, "/", "", "").await;
    assert_eq!(status, 200, "{page}");
    let shown = page
        .split(r#"<span data-type=""#)
        .skip(1)
        .map(|cell| {
            let (event_type, rest) = cell.split_once('"').unwrap();
            let state = rest
                .split(r#"data-state=""#)
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            let n: u64 = rest
                .split('>')
                .nth(1)
                .unwrap()
                .split('<')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            (event_type.to_owned(), state.to_owned(), n)
        })
        .collect::<Vec<_>>();
    let cli = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(global)
        .args(["--url", url, "--output", "json", "status"])
        .output()
        .await
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    let mut from_status = Vec::new();
    for t in status["event_types"].as_array().unwrap() {
        for state in ["claimable", "parked", "blocked", "in_flight", "failed"] {
            from_status.push((
                t["event_type"].as_str().unwrap().to_owned(),
                state.to_owned(),
                t[state].as_u64().unwrap(),
            ));
        }
    }
    assert_eq!(shown, from_status, "{page}");
    let newest = store.failed_events(100).await.unwrap();
    assert!(store.last_sequence().await.unwrap() >= newest.iter().map(|f| f.event.sequence).max());
    assert!(
        store.last_sequence().await.unwrap().is_some(),
        "the SQL stores know it"
    );
    let stats = store.stats().await.unwrap();
    assert_eq!((stats[0].blocked, stats[0].failed), (2, 1), "{stats:?}");
    assert!(shown.contains(&("invoice.paid".into(), "blocked".into(), 2)));
    assert!(
        page.contains("1 keys blocked by failed events, 2 events waiting behind them"),
        "{page}"
    );
    let blocked = page
        .split(r#"<table id="blocked-keys">"#)
        .nth(1)
        .expect("a blocked keys table");
    assert!(
        blocked.contains("acct-0") && blocked.contains(&poison.to_string()),
        "{blocked}"
    );
    assert!(
        page.split(r#"<table id="relays">"#)
            .nth(1)
            .unwrap()
            .contains("overview-0")
    );
}
