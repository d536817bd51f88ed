//! The overview against `outbox status` on the two servers.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::store::OutboxAdmin;
use outbox_core::{EventId, OutboxWriter};
use outbox_sqlx::StoreConfig;
use serde_json::json;

use outbox_core::chrono;

use super::{dashboard_with, event, http_to};

/// On PostgreSQL and MariaDB, in the status test's situations at once (a
/// blocked key with events behind it, a retry backoff, a delayed event, a
/// batch in flight, a free key): the overview's counts are `outbox
/// status`'s and `stats()`'s, it says what holds publication back, and
/// lists the blocked key with its blocking event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_says_what_status_says_on_postgres_and_mariadb() {
    use outbox_sqlx::mysql::MySqlStore;
    use outbox_sqlx::postgres::EndToEndDb;

    let db = EndToEndDb::create("dashboard").await;
    let pg_url = std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_test".into());
    let poison = every_situation(&db.store).await;
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
    let poison = every_situation(&store).await;
    overview_matches_status(&*store, &mysql_url, &["--schema", &database], poison).await;
    sqlx::query(&format!("DROP DATABASE {database}"))
        .execute(&pool)
        .await
        .unwrap();
}

/// The status test's situations at once (`store_suite::status_adds_up`),
/// on store time: a key blocked behind a failed event with two events
/// behind it, a key in retry backoff with one behind it, a key whose first
/// event is delayed, a key with a batch in flight, and a free key.
/// Returns the blocking event's id.
async fn every_situation<S: outbox_core::testing::ConformingStore>(store: &Arc<S>) -> EventId {
    use outbox_core::store::{ClaimRequest, FailReason, Nack, NackAction, RelayId};
    use outbox_core::{ErrorClass, Ordering, PoisonPolicy};

    let at = |key: &str, n: usize| event("invoice.paid", key, json!({"n": n}));
    let (b1, r1, f1) = (at("blk", 1), at("retry", 1), at("fly", 1));
    OutboxWriter::enqueue(&**store, &[b1.clone(), r1.clone(), f1.clone()])
        .await
        .unwrap();
    let request = ClaimRequest {
        owner: RelayId::new("overview"),
        limit: 10,
        lease_duration: Duration::from_secs(300),
        ordering: Ordering::PerKey,
        poison: PoisonPolicy::Block,
        crash_loop_limit: 3,
    };
    let first = store.claim_batch(&request).await.unwrap().events;
    assert_eq!(first.len(), 3);
    let lease = |id: EventId| {
        first
            .iter()
            .find(|c| c.event.event_id == id)
            .unwrap()
            .lease
            .clone()
    };
    let nack = |id, action, error_class| Nack {
        lease: lease(id),
        action,
        error_class,
        error: "refused".into(),
    };
    store
        .nack(&[
            nack(
                b1.event_id,
                NackAction::Fail {
                    reason: FailReason::Permanent,
                    block_key: true,
                },
                ErrorClass::Permanent,
            ),
            nack(
                r1.event_id,
                NackAction::Retry {
                    after: Duration::from_secs(600),
                },
                ErrorClass::Transient,
            ),
        ])
        .await
        .unwrap();
    // f1 stays in flight.
    let mut voided = at("blk", 2);
    voided.event_type = "invoice.voided".into();
    let mut delayed = at("delay", 1);
    delayed.available_at = Some(chrono::Utc::now() + chrono::Duration::seconds(600));
    let behind = [
        voided,
        at("blk", 3),
        at("retry", 2),
        at("fly", 2),
        delayed,
        at("delay", 2),
        at("free", 1),
    ];
    OutboxWriter::enqueue(&**store, &behind).await.unwrap();
    b1.event_id
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
    let from_stats = stats
        .iter()
        .flat_map(|s| {
            s.counts()
                .map(|(state, n)| (s.event_type.clone(), state.to_owned(), n))
        })
        .collect::<Vec<_>>();
    assert_eq!(shown, from_stats, "{page}");
    let total = |state: &str| {
        shown
            .iter()
            .filter(|c| c.1 == state)
            .map(|c| c.2)
            .sum::<u64>()
    };
    assert_eq!(
        ["claimable", "parked", "blocked", "in_flight", "failed"].map(total),
        // claimable: retry 2, fly 2, delay 2, free 1; parked: retry 1,
        // delay 1; blocked: blk 2 (voided) and blk 3; in flight: fly 1;
        // failed: blk 1.
        [4, 2, 2, 1, 1],
        "{page}"
    );
    for cause in [
        "1 keys blocked by failed events, 2 events waiting behind them",
        "keys in retry backoff or delay",
    ] {
        assert!(page.contains(cause), "{cause}: {page}");
    }
    let blocked = page
        .split(r#"<table id="blocked-keys">"#)
        .nth(1)
        .expect("a blocked keys table");
    assert!(
        blocked.contains(">blk<") && blocked.contains(&poison.to_string()),
        "{blocked}"
    );
}
