//! Producers that are not this crate: another language enqueueing with SQL
//! through the documented function, and two-phase producers.

use super::*;

/// Runs `psql -c sql` against the shared server; (success, stdout, stderr).
pub(super) fn psql(sql: &str) -> (bool, String, String) {
    let output = std::process::Command::new("psql")
        .args([
            "-X",
            "-q",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "VERBOSITY=verbose",
            "-d",
        ])
        .arg(shared_url())
        .args(["-c", sql])
        .output()
        .expect("run psql");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    )
}

/// Another language enqueues with SQL (DESIGN.md §3; README "Enqueue from
/// SQL"): the function validates like the Rust enqueue (typed SQLSTATE
/// 22023 errors), reports a duplicate as NULL, honours delays on store time;
/// a plain INSERT with the column defaults works too and the table's checks
/// refuse what cannot be an event. The relay reads both back as events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn another_language_enqueues_with_sql() {
    let clock = ManualClock::at_epoch();
    let (store, schema) = shared_store(clock.clone()).await;
    let id = EventId::random();
    let call = |event_id: EventId, event_type: &str, headers: &str, extra: &str| {
        format!(
            "SELECT {schema}.outbox_enqueue('{event_id}', '{event_type}', 'invoice', 'inv-7', \
             '{{\"amount_cents\": 1200}}', 'sub-1', '{headers}'{extra})"
        )
    };
    let headers = r#"{"correlation_id": "c-9", "tenant": "acme"}"#;
    let (ok, sequence, err) = psql(&call(id, "invoice.paid", headers, ""));
    assert!(ok, "{err}");
    assert!(
        sequence.parse::<i64>().is_ok(),
        "returns the sequence: {sequence:?}"
    );
    let (ok, again, _) = psql(&call(id, "invoice.paid", headers, ""));
    assert!(ok);
    assert_eq!(again, "", "a duplicate id is a no-op, reported as NULL");
    for (bad, reason) in [
        (call(EventId::random(), "", headers, ""), "event_type"),
        (
            call(EventId::random(), "x", r#"{"tenant": 5}"#, ""),
            "string",
        ),
        (call(EventId::random(), "x", "[]", ""), "object"),
        (
            call(EventId::random(), "x", headers, ", p_delay => '-1 hour'"),
            "negative",
        ),
        // A header named like the envelope, as Rust's enqueue refuses it.
        (
            call(EventId::random(), "x", r#"{"event_id": "forged"}"#, ""),
            "reserved",
        ),
        (
            call(EventId::random(), "x", r#"{"outbox_headers": "{}"}"#, ""),
            "reserved",
        ),
    ] {
        let (ok, _, err) = psql(&bad);
        assert!(!ok, "{bad} was accepted");
        assert!(err.contains("22023") && err.contains(reason), "{err}");
    }
    let (ok, _, err) = psql(&format!(
        "SELECT {schema}.outbox_enqueue(gen_random_uuid(), 't', 'a', 'b', to_jsonb(repeat('x', 300 * 1024)))"
    ));
    assert!(
        !ok && err.contains("larger than the limit"),
        "{}",
        &err[..err.len().min(300)]
    );
    let delayed = EventId::random();
    let (ok, _, err) = psql(&format!(
        "SELECT {schema}.outbox_enqueue('{delayed}', 'invoice.reminded', 'invoice', 'inv-7', \
         '{{}}', 'sub-2', p_delay => '1 hour')"
    ));
    assert!(ok, "{err}");
    // A plain INSERT: the defaults number, order and time it.
    let raw = EventId::random();
    let (ok, _, err) = psql(&format!(
        "INSERT INTO {schema}.outbox_events (event_id, aggregate_type, aggregate_id, event_type, \
         partition_key, payload) VALUES ('{raw}', 'invoice', 'inv-8', 'invoice.paid', 'sub-1', '{{}}')"
    ));
    assert!(ok, "{err}");
    let (ok, _, err) = psql(&format!(
        "INSERT INTO {schema}.outbox_events (event_id, aggregate_type, aggregate_id, event_type, \
         partition_key, payload) VALUES (gen_random_uuid(), 'invoice', 'inv-9', 'invoice.paid', '', '{{}}')"
    ));
    assert!(
        !ok && err.contains("check"),
        "an empty key was accepted: {err}"
    );

    let claimed = store.claim_batch(&request("r1", 10)).await.unwrap();
    assert!(claimed.unreadable.is_empty(), "{:?}", claimed.unreadable);
    let got: Vec<EventId> = claimed.events.iter().map(|c| c.event.event_id).collect();
    assert_eq!(got, vec![id, raw], "in insert order; the delayed one waits");
    let first = &claimed.events[0].event;
    assert_eq!(first.partition_key, "sub-1");
    assert_eq!(first.headers.correlation_id.as_deref(), Some("c-9"));
    assert_eq!(first.headers.extra["tenant"], "acme");
    let leases: Vec<_> = claimed.events.iter().map(|c| c.lease.clone()).collect();
    store.ack(&leases).await.unwrap();
    clock.advance(Duration::from_secs(3601));
    let later = store.claim_batch(&request("r1", 10)).await.unwrap();
    assert_eq!(
        later
            .events
            .iter()
            .map(|c| c.event.event_id)
            .collect::<Vec<_>>(),
        vec![delayed],
        "the delay counts on store time"
    );
}

/// Two-phase commit (README, "Two-phase commit"): while a relay waits for
/// NOTIFY, an insert would notify and PREPARE TRANSACTION fails; a producer
/// that sets `outbox.notify = 'off'` for its transaction prepares, commits
/// later, and the relay publishes its event by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn two_phase_producers_prepare_with_notify_off() {
    use outbox_core::memory::RecordingPublisher;
    use outbox_core::{CancellationToken, Relay, RelayConfig};
    use sqlx::Connection;

    let cluster = PrivatePg::start(&["max_prepared_transactions = 4"]);
    let url = cluster.url("postgres");
    let pool = PgPoolOptions::new()
        .max_connections(6)
        .connect(&url)
        .await
        .unwrap();
    let store = PgStore::new(pool.clone(), StoreConfig::default());
    store.migrate().await.unwrap();
    let broker = Arc::new(RecordingPublisher::new());
    let shutdown = CancellationToken::new();
    let config = RelayConfig {
        poll_interval: Duration::from_millis(200),
        ..RelayConfig::default()
    };
    let relay = Relay::new(Arc::new(store.clone()), broker.clone(), config)
        .unwrap()
        .with_wake_up(store.wake_up().await.unwrap())
        .spawn(shutdown.clone());
    tokio::time::timeout(Duration::from_secs(10), async {
        while !sqlx::query_scalar::<_, bool>(
            "SELECT pg_sequence_last_value('outbox_relay_waiting') IS NOT DISTINCT FROM 1",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the idle relay asks for NOTIFY");

    let enqueue = |id: EventId| {
        format!("SELECT outbox_enqueue('{id}', 'invoice.paid', 'invoice', 'inv-1', '{{}}'::jsonb)")
    };
    let mut producer = sqlx::PgConnection::connect(&url).await.unwrap();
    let refused = sqlx::raw_sql(&format!(
        "BEGIN; {}; PREPARE TRANSACTION 'without_setting'",
        enqueue(EventId::random())
    ))
    .execute(&mut producer)
    .await
    .expect_err("a transaction that notified cannot be prepared");
    assert!(refused.to_string().contains("NOTIFY"), "{refused}");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut producer)
        .await
        .unwrap();

    let prepared = EventId::random();
    sqlx::raw_sql(&format!(
        "BEGIN; SET LOCAL outbox.notify = 'off'; {}; PREPARE TRANSACTION 'with_setting'",
        enqueue(prepared)
    ))
    .execute(&mut producer)
    .await
    .expect("prepared");
    sqlx::raw_sql("COMMIT PREPARED 'with_setting'")
        .execute(&mut producer)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), broker.wait_for_deliveries(1))
        .await
        .expect("published by polling after COMMIT PREPARED");
    assert_eq!(broker.delivered_ids(), vec![prepared]);
    shutdown.cancel();
    relay.await.unwrap().unwrap();
}

/// A producer whose role holds only what the enqueue itself touches (the
/// events table, its sequence, the control row store time is read from)
/// enqueues, and its commit wakes a waiting relay: `migrate()` grants the
/// wake-up flag to every role, so the flag asked no team for a new grant.
/// A relay's role may set it back the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_producer_role_with_only_the_tables_grants_enqueues_and_wakes_the_relay() {
    let (store, schema) = shared_store(ManualClock::at_epoch()).await;
    let role = format!("{schema}_producer");
    sqlx::raw_sql(&format!(
        "CREATE ROLE {role} NOLOGIN;
         GRANT USAGE ON SCHEMA {schema} TO {role};
         GRANT INSERT, SELECT ON {schema}.outbox_events TO {role};
         GRANT USAGE ON SEQUENCE {schema}.outbox_events_seq TO {role};
         GRANT SELECT ON {schema}.outbox_control TO {role};"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .unwrap();
    listener.listen(store.channel()).await.unwrap();
    // A relay waits: what its idle probe leaves behind.
    let flag = format!("{schema}.outbox_relay_waiting");
    sqlx::query(&format!("SELECT setval('{flag}', 1)"))
        .execute(store.pool())
        .await
        .unwrap();

    let mut producer = store.pool().begin().await.unwrap();
    sqlx::query(&format!("SET LOCAL ROLE {role}"))
        .execute(&mut *producer)
        .await
        .unwrap();
    let enqueued = store.enqueue(&mut producer, &[event("a", 1)]).await;
    producer.commit().await.unwrap();
    let cleared = async {
        let mut relay = store.pool().begin().await.unwrap();
        sqlx::query(&format!("SET LOCAL ROLE {role}"))
            .execute(&mut *relay)
            .await
            .unwrap();
        let cleared = sqlx::query(&format!("SELECT setval('{flag}', 0)"))
            .execute(&mut *relay)
            .await;
        relay.rollback().await.unwrap();
        cleared
    }
    .await;
    let woken = tokio::time::timeout(Duration::from_secs(10), listener.recv()).await;
    sqlx::raw_sql(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .execute(store.pool())
        .await
        .unwrap();

    assert!(
        matches!(
            enqueued.expect("the producer's role enqueues")[..],
            [outbox_core::store::EnqueueOutcome::Inserted { .. }]
        ),
        "one new row"
    );
    assert_eq!(
        woken
            .expect("the producer's commit notified the waiting relay")
            .unwrap()
            .payload(),
        ""
    );
    cleared.expect("a role without grants on the flag sets it back");
}
