//! The `outbox` binary run as an operator would, against live PostgreSQL
//! and a SQLite file: exit statuses, text and JSON output, and repairs
//! recorded in the event's history.

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::memory::{Fault, RecordingPublisher};
use outbox_core::store::{AttemptKind, EventState, OutboxAdmin};
use outbox_core::testing::{ConformingStore, RelayFleet, events_over_keys};
use outbox_core::{ErrorClass, NewEvent, OutboxWriter, PoisonPolicy};
use outbox_sqlx::StoreConfig;
use outbox_sqlx::postgres::EndToEndDb;
use outbox_sqlx::sqlite::SqliteStore;
use serde_json::Value;

mod tenants;

const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/outbox_test";

fn pg_url() -> String {
    std::env::var("OUTBOX_PG_URL").unwrap_or_else(|_| PG_URL.into())
}

/// Runs `outbox` with `args`; the store comes from OUTBOX_URL.
async fn outbox(url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .env("OUTBOX_URL", url)
        .output()
        .await
        .expect("the binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(output)))
}

/// Enqueues `events` and starts a relay under `PoisonPolicy::Block` whose
/// publisher fails the first event permanently; returns, relay running,
/// once that event blocks its key and `delivered` others went out.
async fn block_on_the_first<S: ConformingStore>(
    store: &Arc<S>,
    events: &[NewEvent],
    delivered: usize,
) -> (Arc<RecordingPublisher>, RelayFleet) {
    OutboxWriter::enqueue(&**store, events).await.unwrap();
    let publisher = Arc::new(RecordingPublisher::new());
    publisher.inject(events[0].event_id, Fault::FailAlways(ErrorClass::Permanent));
    let relays = RelayFleet::spawn_with(store.clone(), publisher.clone(), "cli", 1, block);
    tokio::time::timeout(Duration::from_secs(30), async {
        while store.blocked_keys().await.unwrap().is_empty()
            || publisher.delivered().len() < delivered
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the poison event blocks its key, the other keys drain");
    (publisher, relays)
}

fn block(config: &mut outbox_core::RelayConfig) {
    config.poison = PoisonPolicy::Block;
}

/// Migrate over tables already there (twice: the same one line each time),
/// a failed event that blocks its key, then status, health, failed
/// list/show and requeue, each as an operator would see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_a_blocked_key_repairs_it_and_health_recovers() {
    let db = EndToEndDb::create("cli").await;
    let (store, schema) = (db.store.clone(), db.schema.clone());
    let url = pg_url();
    for _ in 0..2 {
        let migrated = outbox(&url, &["--schema", &schema, "migrate"]).await;
        assert!(migrated.status.success(), "{}", stderr(&migrated));
        assert_eq!(
            stdout(&migrated),
            "PostgreSQL outbox tables at schema version 2: already current\n"
        );
        assert_eq!(stderr(&migrated), "", "migrate is quiet");
    }

    let events = events_over_keys(12, 3);
    let poison = events[0].event_id;
    let (publisher, relays) = block_on_the_first(&store, &events, 8).await;
    relays.stop(Duration::from_secs(30)).await;

    let status = outbox(&url, &["--schema", &schema, "--output", "json", "status"]).await;
    assert!(status.status.success(), "{}", stderr(&status));
    let status = json(&status);
    assert_eq!(status["schema_version"], 2, "{status}");
    let relays = status["relays"].as_array().unwrap();
    assert!(!relays.is_empty(), "{status}");
    assert!(
        relays
            .iter()
            .all(|r| r["silent_s"].as_f64().unwrap() >= 0.0),
        "{status}"
    );
    let blocked = status["blocked_keys"].as_array().unwrap();
    assert_eq!(blocked.len(), 1, "{status}");
    assert_eq!(blocked[0]["blocking_event_id"], poison.to_string());
    assert_eq!(blocked[0]["backlog"], 3, "{status}");
    let failed_total: u64 = status["event_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["failed"].as_u64().unwrap())
        .sum();
    assert_eq!(failed_total, 1, "{status}");
    assert!(
        status["held_back"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["kind"] == "blocked_keys"),
        "{status}"
    );

    let text = outbox(&url, &["--schema", &schema, "status"]).await;
    assert!(
        stdout(&text).starts_with("PostgreSQL outbox, schema version 2\n"),
        "{}",
        stdout(&text)
    );
    assert!(
        stdout(&text).contains(" s ago; clock skew"),
        "{}",
        stdout(&text)
    );
    assert!(
        stdout(&text).contains(&format!("behind failed event {poison}")),
        "{}",
        stdout(&text)
    );

    let health = outbox(&url, &["--schema", &schema, "health"]).await;
    assert_eq!(health.status.code(), Some(1), "{}", stdout(&health));
    let reason = stderr(&health);
    assert_eq!(reason.lines().count(), 1, "one line: {reason}");
    assert!(reason.contains("keys blocked by failed events"), "{reason}");

    let list = outbox(
        &url,
        &["--schema", &schema, "--output", "json", "failed", "list"],
    )
    .await;
    let list = json(&list);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["event_id"], poison.to_string());
    assert_eq!(list[0]["blocks_key"], true);

    let id = poison.to_string();
    let show = outbox(
        &url,
        &[
            "--schema", &schema, "--output", "json", "failed", "show", &id,
        ],
    )
    .await;
    let show = json(&show);
    assert_eq!(show["history"][0]["kind"], "PermanentFailure", "{show}");
    assert_eq!(show["partition_key"], events[0].partition_key);
    // The payload as the store keeps it (PostgreSQL's jsonb spaces it).
    let stored = store.failed_events(10).await.unwrap()[0]
        .event
        .event
        .payload
        .clone();
    assert_eq!(show["event"]["payload_bytes"], stored.len(), "{show}");
    assert!(
        show.get("payload").is_none(),
        "no payload unless asked: {show}"
    );
    let with_payload = outbox(
        &url,
        &[
            "--schema",
            &schema,
            "--output",
            "json",
            "failed",
            "show",
            &id,
            "--payload",
        ],
    )
    .await;
    let expected: Value = serde_json::from_str(events[0].payload.as_str()).unwrap();
    assert_eq!(json(&with_payload)["payload"], expected);
    // For people: metadata and history, the payload only when asked.
    let text = stdout(&outbox(&url, &["--schema", &schema, "failed", "show", &id]).await);
    assert!(text.contains("history:"), "{text}");
    assert!(text.contains("PermanentFailure"), "{text}");
    assert!(text.contains("(--payload prints it)"), "{text}");
    assert!(!text.contains(stored.as_str()), "{text}");
    let text = stdout(
        &outbox(
            &url,
            &["--schema", &schema, "failed", "show", &id, "--payload"],
        )
        .await,
    );
    assert!(text.contains(stored.as_str()), "{text}");

    let refused = outbox(
        &url,
        &[
            "--schema",
            &schema,
            "requeue",
            &id,
            "--reason",
            " ",
            "--operator",
            "alice",
        ],
    )
    .await;
    assert_eq!(refused.status.code(), Some(2), "an empty reason is refused");

    publisher.clear(poison);
    let requeued = outbox(
        &url,
        &[
            "--schema",
            &schema,
            "requeue",
            &id,
            "--reason",
            "broker fixed",
            "--operator",
            "alice",
        ],
    )
    .await;
    assert!(requeued.status.success(), "{}", stderr(&requeued));
    let history = store.history(poison).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(
        (last.kind, last.actor.as_str(), last.detail.as_str()),
        (AttemptKind::Requeued, "alice", "broker fixed")
    );

    let relays = RelayFleet::spawn(store.clone(), publisher.clone(), "cli-after", 1);
    publisher.wait_for_deliveries(12).await;
    let drained = relays.stop(Duration::from_secs(30)).await;
    assert_eq!(drained.failed, 0, "{drained:?}");
    assert!(matches!(
        store.event_state(poison).await.unwrap(),
        Some(EventState::Published { .. })
    ));
    let health = outbox(&url, &["--schema", &schema, "--output", "json", "health"]).await;
    assert!(health.status.success(), "{}", stderr(&health));
    assert_eq!(json(&health)["healthy"], true);
}

/// A backlog no relay serves is unhealthy once its oldest event is older
/// than --max-age; the reason says how many wait and that no relay reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_fails_on_an_old_backlog_with_no_relay() {
    let dir = std::env::temp_dir().join(format!("outbox-cli-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("outbox.db");
    let url = format!("sqlite:{}", path.display());
    let migrated = outbox(&url, &["migrate"]).await;
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    let store = SqliteStore::open(&path.to_string_lossy(), StoreConfig::default())
        .await
        .unwrap();
    OutboxWriter::enqueue(&store, &events_over_keys(5, 1))
        .await
        .unwrap();
    // Any age above 0 is too old: the events were due before the binary
    // started, so no wait is needed for them to age.
    let health = outbox(&url, &["health", "--max-age", "0s"]).await;
    assert_eq!(health.status.code(), Some(1));
    let reason = stderr(&health);
    assert!(
        reason.contains("5 invoice.paid events claimable"),
        "{reason}"
    );
    let json_health = outbox(&url, &["--output", "json", "health", "--max-age", "0s"]).await;
    let problems = json(&json_health)["problems"].as_array().unwrap().clone();
    assert!(
        problems
            .iter()
            .any(|p| p.as_str().unwrap().contains("no relay reported")),
        "{problems:?}"
    );
    let lenient = outbox(
        &url,
        &["health", "--max-age", "1h", "--relay-timeout", "1h"],
    )
    .await;
    assert_eq!(lenient.status.code(), Some(1), "still no relay at all");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Bad input exits 2 with the reason; a store that cannot be reached
/// exits 3; a missing SQLite file is not created by a read command.
#[tokio::test]
async fn bad_input_and_unreachable_stores_say_why() {
    let missing = std::env::temp_dir().join(format!("outbox-cli-{}.db", uuid::Uuid::new_v4()));
    let url = format!("sqlite:{}", missing.display());
    let status = outbox(&url, &["status"]).await;
    assert_eq!(status.status.code(), Some(1));
    assert!(stderr(&status).contains("no SQLite database"));
    assert!(!missing.exists(), "a read command created the file");

    let purge = outbox(&url, &["purge", "--older-than", "7"]).await;
    assert_eq!(purge.status.code(), Some(2));
    assert!(stderr(&purge).contains("no unit"), "{}", stderr(&purge));

    let scheme = outbox("redis://127.0.0.1", &["status"]).await;
    assert_eq!(scheme.status.code(), Some(2));
    assert!(stderr(&scheme).contains("must start with postgres://"));

    let unreachable = outbox("postgres://postgres@127.0.0.1:1/x", &["status"]).await;
    assert_eq!(
        unreachable.status.code(),
        Some(3),
        "{}",
        stderr(&unreachable)
    );
    assert!(stderr(&unreachable).contains("cannot reach the PostgreSQL store"));

    let bad_id = outbox(&url, &["failed", "show", "not-a-uuid"]).await;
    assert_eq!(bad_id.status.code(), Some(2));
}

/// `migrate` reports the schema version it found and left; every read
/// command on an un-migrated store says so in one line; tables of another
/// schema version are refused untouched, naming the upgrade notes.
#[tokio::test]
async fn migrate_knows_where_the_schema_stands() {
    let dir = std::env::temp_dir().join(format!("outbox-cli-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("outbox.db");
    let url = format!("sqlite:{}", path.display());
    std::fs::File::create(&path).unwrap();
    for command in [&["status"][..], &["health"][..]] {
        let unmigrated = outbox(&url, command).await;
        assert_eq!(unmigrated.status.code(), Some(1), "{command:?}");
        let reason = stderr(&unmigrated);
        assert_eq!(reason.lines().count(), 1, "one line: {reason}");
        assert!(reason.contains("outbox migrate"), "{command:?}: {reason}");
    }

    let created = outbox(&url, &["--output", "json", "migrate"]).await;
    assert!(created.status.success(), "{}", stderr(&created));
    assert_eq!(
        json(&created),
        serde_json::json!({"store": "SQLite", "schema_version": 2, "found": null, "created": true})
    );
    let again = outbox(&url, &["--output", "json", "migrate"]).await;
    assert_eq!(json(&again)["found"], 2);
    assert_eq!(json(&again)["created"], false);

    // Tables an older release made: refused, and left as they were.
    let store = SqliteStore::open(&path.to_string_lossy(), StoreConfig::default())
        .await
        .unwrap();
    sqlx::query("UPDATE outbox_schema_version SET version = 1")
        .execute(store.pool())
        .await
        .unwrap();
    let refused = outbox(&url, &["migrate"]).await;
    assert_eq!(refused.status.code(), Some(1));
    let reason = stderr(&refused);
    assert!(
        reason.contains("schema version 1") && reason.contains("Upgrading to schema version 2"),
        "{reason}"
    );
    assert_eq!(store.schema_version().await.unwrap(), Some(1), "untouched");
    let status = outbox(&url, &["--output", "json", "status"]).await;
    assert_eq!(json(&status)["schema_version"], 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn mysql_url() -> String {
    std::env::var("OUTBOX_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

/// On MariaDB: a poison event blocking its key is superseded by a fixed
/// one, which is published in its place ahead of the key's waiting events;
/// the old event links to it; purge deletes published events in batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supersede_and_purge_on_mariadb() {
    use outbox_sqlx::mysql::MySqlStore;
    let pool = sqlx::MySqlPool::connect(&mysql_url())
        .await
        .unwrap_or_else(|e| panic!("MySQL/MariaDB unreachable at {}: {e}", mysql_url()));
    let database = format!(
        "outbox_t_cli_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&pool)
        .await
        .unwrap();
    let url = mysql_url().replacen("mysql://", "mariadb://", 1);
    for expected in [
        "MySQL/MariaDB outbox tables created at schema version 2\n",
        "MySQL/MariaDB outbox tables at schema version 2: already current\n",
    ] {
        let migrated = outbox(&url, &["--schema", &database, "migrate"]).await;
        assert!(migrated.status.success(), "{}", stderr(&migrated));
        assert_eq!(stdout(&migrated), expected);
    }
    let store = Arc::new(MySqlStore::new(
        pool,
        StoreConfig::with_tables(
            outbox_sqlx::TableNames::default()
                .in_schema(&database)
                .unwrap(),
        ),
    ));
    let events = events_over_keys(6, 2);
    let poison = events[0].event_id;
    let (publisher, relays) = block_on_the_first(&store, &events, 3).await;
    relays.stop(Duration::from_secs(30)).await;

    let id = poison.to_string();
    let superseded = outbox(
        &url,
        &[
            "--schema",
            &database,
            "supersede",
            &id,
            "--payload",
            r#"{"amount": 42}"#,
            "--reason",
            "fixed payload",
            "--operator",
            "bob",
        ],
    )
    .await;
    assert!(superseded.status.success(), "{}", stderr(&superseded));
    let printed = stdout(&superseded);
    let replacement: outbox_core::EventId = printed
        .trim()
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("{printed}: {e}"));

    let relays = RelayFleet::spawn_with(store.clone(), publisher.clone(), "cli-after", 1, block);
    publisher.wait_for_deliveries(6).await;
    relays.stop(Duration::from_secs(30)).await;
    let key = &events[0].partition_key;
    let key_order: Vec<_> = publisher
        .delivered()
        .into_iter()
        .filter(|d| &d.event.partition_key == key)
        .map(|d| d.event.event_id)
        .collect();
    let waiting: Vec<_> = events
        .iter()
        .filter(|e| &e.partition_key == key && e.event_id != poison)
        .map(|e| e.event_id)
        .collect();
    let mut expected = vec![replacement];
    expected.extend(waiting);
    assert_eq!(
        key_order, expected,
        "the replacement takes the poison's place"
    );
    let delivered = publisher
        .delivered()
        .into_iter()
        .find(|d| d.event.event_id == replacement)
        .unwrap();
    assert_eq!(
        delivered.event.payload.deserialize::<Value>().unwrap(),
        serde_json::json!({"amount": 42})
    );

    let show = outbox(
        &url,
        &[
            "--schema", &database, "--output", "json", "failed", "show", &id,
        ],
    )
    .await;
    assert_eq!(json(&show)["superseded_by"], replacement.to_string());

    let purged = outbox(
        &url,
        &[
            "--schema",
            &database,
            "purge",
            "--older-than",
            "0s",
            "--batch-size",
            "2",
        ],
    )
    .await;
    assert!(purged.status.success(), "{}", stderr(&purged));
    assert_eq!(stdout(&purged), "purged 6 published events\n");
    assert!(matches!(
        store.event_state(poison).await.unwrap(),
        Some(EventState::Failed { .. })
    ));
}

/// On SQLite: `skip` lets a blocked key flow again (the event stays
/// failed, the skip in its history); `purge --inbox` deletes inbox claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_and_purge_the_inbox_on_sqlite() {
    use outbox_core::InboxStore;
    let dir = std::env::temp_dir().join(format!("outbox-cli-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("outbox.db");
    let url = format!("sqlite:{}", path.display());
    assert!(outbox(&url, &["migrate"]).await.status.success());
    let store = Arc::new(
        SqliteStore::open(&path.to_string_lossy(), StoreConfig::default())
            .await
            .unwrap(),
    );
    let events = events_over_keys(3, 1);
    let poison = events[0].event_id;
    let (publisher, relays) = block_on_the_first(&store, &events, 0).await;
    assert!(publisher.delivered().is_empty());

    let id = poison.to_string();
    let skipped = outbox(
        &url,
        &["skip", &id, "--reason", "obsolete", "--operator", "carol"],
    )
    .await;
    assert!(skipped.status.success(), "{}", stderr(&skipped));
    publisher.wait_for_deliveries(2).await;
    relays.stop(Duration::from_secs(30)).await;
    assert!(matches!(
        store.event_state(poison).await.unwrap(),
        Some(EventState::Failed { .. })
    ));
    let last = store.history(poison).await.unwrap().pop().unwrap();
    assert_eq!(
        (last.kind, last.actor.as_str()),
        (AttemptKind::Skipped, "carol")
    );

    let inbox = store.inbox();
    let mut tx = inbox.begin().await.unwrap();
    assert!(
        inbox
            .claim(&mut tx, "billing", events[1].event_id)
            .await
            .unwrap()
    );
    inbox.commit(tx).await.unwrap();
    let purged = outbox(&url, &["purge", "--older-than", "0s", "--inbox"]).await;
    assert!(purged.status.success(), "{}", stderr(&purged));
    assert_eq!(
        stdout(&purged),
        "purged 2 published events\npurged 1 inbox claims\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
