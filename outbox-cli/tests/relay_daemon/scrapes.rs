//! `/metrics` while the store's backlog read is slow (its table locked by
//! another session, as a long migration or `VACUUM FULL` would): each
//! scrape answers within the daemon's wait with the last values read,
//! concurrent scrapes start one read between them, and the gauges move on
//! once the store answers; while the read fails, each failure is counted
//! and the next scrape a second later tries again.

use std::time::{Duration, Instant};

use outbox_core::OutboxWriter;
use outbox_sqlx::postgres::EndToEndDb;
use sqlx::Connection;

use super::{
    ConfigFile, billing_events, free_address, gauge, get, pg_url, redis_url, scrape_until,
    spawn_daemon, unique,
};

const READ_AT: &str = "outbox_backlog_read_timestamp_seconds";

/// How many sessions are running the backlog read of `schema` now.
async fn backlog_reads(conn: &mut sqlx::PgConnection, schema: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE pid <> pg_backend_pid() AND query LIKE '%' || $1 || '%outbox_stats()%'
           AND state = 'active'",
    )
    .bind(schema)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A daemon relaying a fresh schema that holds two events, once its
/// first backlog read is on `/metrics`.
struct Scraped {
    db: EndToEndDb,
    listen: String,
    /// The first scrape with the backlog gauges, and when they were read.
    first: String,
    read_at: f64,
    _config: ConfigFile,
    _daemon: tokio::process::Child,
}

async fn scraped_daemon(name: &str) -> Scraped {
    let db = EndToEndDb::create(name).await;
    OutboxWriter::enqueue(&*db.store, &billing_events(2))
        .await
        .unwrap();
    let listen = free_address();
    let config = ConfigFile::with(&format!(
        r#"
url = "{url}"
schema = "{schema}"

[relay]
id = "{name}-test"
poll_interval = "100ms"

[broker]
kind = "redis"
url = "{redis}"
stream_prefix = "{prefix}:"

[http]
listen = "{listen}"
"#,
        url = pg_url(),
        schema = db.schema,
        redis = redis_url(),
        prefix = unique(name),
    ));
    let daemon = spawn_daemon(&config);
    let first = scrape_until(&listen, |m| gauge(m, READ_AT).is_some()).await;
    Scraped {
        read_at: gauge(&first, READ_AT).unwrap(),
        db,
        listen,
        first,
        _config: config,
        _daemon: daemon,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_backlog_read_neither_holds_scrapes_nor_piles_up() {
    let scraped = scraped_daemon("scrapes").await;
    let (schema, listen, read_at) = (&scraped.db.schema, &scraped.listen, scraped.read_at);

    // Another session takes the events table: the backlog read waits on it.
    let mut locker = sqlx::PgConnection::connect(&pg_url()).await.unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE {schema}.outbox_events IN ACCESS EXCLUSIVE MODE"
    ))
    .execute(&mut locker)
    .await
    .unwrap();
    // Past the last read's freshness (a fast read is served for 1 s).
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let started = Instant::now();
    let scrapes = (0..5)
        .map(|_| {
            let listen = listen.clone();
            tokio::spawn(async move { get(&listen, "/metrics").await })
        })
        .collect::<Vec<_>>();
    for scrape in scrapes {
        let (status, body) = tokio::time::timeout(Duration::from_secs(8), scrape)
            .await
            .expect("a scrape answers within the daemon's wait (5 s)")
            .unwrap();
        assert!(status.contains("200"), "{status}");
        assert_eq!(
            gauge(&body, READ_AT),
            Some(read_at),
            "the last values, saying when they were read"
        );
    }
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(8),
        "five scrapes answered in {waited:?} (the daemon waits 5 s at most)"
    );
    let mut observer = sqlx::PgConnection::connect(&pg_url()).await.unwrap();
    assert_eq!(
        backlog_reads(&mut observer, schema).await,
        1,
        "one read for all the scrapes"
    );

    // The store answers again: the read that waited sets the gauges.
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    let moved = scrape_until(listen, |m| gauge(m, READ_AT).is_some_and(|at| at > read_at)).await;
    assert!(gauge(&moved, "outbox_backlog_read_seconds").unwrap() >= 1.0);
}

/// `/metrics` while the backlog read fails (the stats function gone, as a
/// half-applied migration by hand would leave it): each scrape answers at
/// once with the last values, counts the failure, and the next scrape
/// after a second tries again (a failed read spaces nothing out); once
/// the store answers, the gauges move on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_backlog_read_is_counted_and_tried_again() {
    const ERRORS: &str = "outbox_store_errors_total{operation=\"stats\"}";
    let scraped = scraped_daemon("scrape_errors").await;
    let (schema, listen, read_at) = (&scraped.db.schema, &scraped.listen, scraped.read_at);
    assert_eq!(gauge(&scraped.first, ERRORS), Some(0.0));

    let rename = |from: &str, to: &str| format!("ALTER FUNCTION {schema}.{from}() RENAME TO {to}");
    let mut admin = sqlx::PgConnection::connect(&pg_url()).await.unwrap();
    sqlx::query(&rename("outbox_stats", "outbox_stats_gone"))
        .execute(&mut admin)
        .await
        .unwrap();
    for failures in 1..=2 {
        // Past the last read's freshness (1 s).
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let started = Instant::now();
        let (status, body) = get(listen, "/metrics").await;
        assert!(status.contains("200"), "{status}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "a failed read answers at once ({:?})",
            started.elapsed()
        );
        assert_eq!(gauge(&body, ERRORS), Some(failures as f64), "{body}");
        assert_eq!(gauge(&body, READ_AT), Some(read_at), "the last values");
    }
    sqlx::query(&rename("outbox_stats_gone", "outbox_stats"))
        .execute(&mut admin)
        .await
        .unwrap();
    scrape_until(listen, |m| gauge(m, READ_AT).is_some_and(|at| at > read_at)).await;
}
