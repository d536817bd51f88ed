//! PostgreSQL outbox → relays → Redis Streams → consumer group → PostgreSQL
//! inbox, with the faults of the Redis issue injected.

mod support;

use outbox_redis::testing::PrivateRedis;
use support::consumer_config;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::memory::RecordingPublisher;
use outbox_core::relay::OutagePolicy;
use outbox_core::store::OutboxAdmin;
use outbox_core::testing::{
    DieAfterCommit, FlakyInbox, OutageCounter, RelayFleet, assert_exactly_once_in_key_order, event,
    events_over_keys,
};
use outbox_core::{CancellationToken, NewEvent, OutboxWriter, RetryPolicy};
use outbox_redis::{
    ConsumerConfig, ConsumerError, ConsumerReport, Handler, HandlerError, RedisConsumer,
    RedisPublisher, StreamEvent, StreamRouter,
};
use outbox_sqlx::postgres::{EffectLog, EndToEndDb, RecordEffect};
use sqlx::{Postgres, Transaction};
use tokio::sync::Notify;

const DEADLINE: Duration = Duration::from_secs(60);

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn database() -> EndToEndDb {
    EndToEndDb::create("e2e").await
}

/// Four relays, 20 keys: each key's events reach the consumer's handler in
/// enqueue order, each applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_keep_key_order_at_the_consumer() {
    let db = database().await;
    let prefix = support::prefix();
    let events = events_over_keys(400, 20);
    OutboxWriter::enqueue(&*db.store, &events).await.unwrap();
    let publisher = Arc::new(RedisPublisher::new(
        support::connect(support::REDIS_URL).await,
        StreamRouter::with_prefix(&prefix),
    ));
    let relays = RelayFleet::spawn(db.store.clone(), publisher, "relay", 4);
    let consumer_stop = CancellationToken::new();
    let consumer = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        consumer_config(&prefix, "c1"),
        db.store.inbox(),
        RecordEffect {
            log: db.log.clone(),
        },
    )
    .expect("valid consumer settings");
    let consumer = tokio::spawn(consumer.run(consumer_stop.clone()));
    db.wait_for_effects(400, DEADLINE).await;
    let report = relays.stop(DEADLINE).await;
    consumer_stop.cancel();
    let consumed = consumer.await.unwrap().unwrap();
    assert_eq!(report.published, 400);
    assert_eq!(consumed.applied, 400);
    assert_exactly_once_in_key_order(&db.effects().await, &events);
}

/// A consumer killed mid-batch, after committing an effect and before
/// acknowledging it: another consumer reclaims its entries and the inbox
/// absorbs the one already applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_mid_batch_is_reclaimed_and_applied_once() {
    let db = database().await;
    let prefix = support::prefix();
    let events = events_over_keys(20, 4);
    OutboxWriter::enqueue(&*db.store, &events).await.unwrap();
    let publisher = Arc::new(RedisPublisher::new(
        support::connect(support::REDIS_URL).await,
        StreamRouter::with_prefix(&prefix),
    ));
    let relays = RelayFleet::spawn(db.store.clone(), publisher, "relay", 1);
    let mut redis = support::connect(support::REDIS_URL).await;
    within("all entries in the stream", async {
        loop {
            let n: usize = redis::AsyncCommands::xlen(&mut redis, format!("{prefix}invoice.paid"))
                .await
                .unwrap();
            if n == 20 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    relays.stop(DEADLINE).await;

    let died = Arc::new(Notify::new());
    // It dies after its fifth commit: one entry to a transaction, so five
    // effects and the fifth entry unacknowledged.
    let mut doomed_config = consumer_config(&prefix, "doomed");
    doomed_config.apply_batch = 1;
    let doomed = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        doomed_config,
        DieAfterCommit::new(db.store.inbox(), 5, died.clone()),
        RecordEffect {
            log: db.log.clone(),
        },
    )
    .expect("valid consumer settings");
    let doomed = tokio::spawn(doomed.run(CancellationToken::new()));
    within("the consumer's death", died.notified()).await;
    doomed.abort();
    let _ = doomed.await;
    assert_eq!(
        db.effects().await.len(),
        5,
        "five effects committed before the crash"
    );

    let stop = CancellationToken::new();
    let survivor = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        consumer_config(&prefix, "survivor"),
        db.store.inbox(),
        RecordEffect {
            log: db.log.clone(),
        },
    )
    .expect("valid consumer settings");
    let survivor = tokio::spawn(survivor.run(stop.clone()));
    db.wait_for_effects(20, DEADLINE).await;
    stop.cancel();
    let report: ConsumerReport = survivor.await.unwrap().unwrap();
    assert_eq!(
        report.duplicates, 1,
        "the committed-but-unacknowledged entry: {report:?}"
    );
    assert_eq!(report.applied, 15, "{report:?}");
    assert!(report.broker.reclaimed >= 16, "{report:?}");
    assert_exactly_once_in_key_order(&db.effects().await, &events);
}

/// The Redis server restarts mid-run: the relay pauses on the outage, burns
/// no attempts, and delivers everything once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_loses_nothing_and_burns_no_attempts() {
    let db = database().await;
    let prefix = support::prefix();
    let mut own = PrivateRedis::start();
    let watch = Arc::new(OutageCounter::new(RedisPublisher::new(
        support::connect(&own.url()).await,
        StreamRouter::with_prefix(&prefix),
    )));
    let relays = RelayFleet::spawn(db.store.clone(), watch.clone(), "relay", 1);
    let stop = CancellationToken::new();
    let consumer = RedisConsumer::new(
        support::connect(&own.url()).await,
        consumer_config(&prefix, "c1"),
        db.store.inbox(),
        RecordEffect {
            log: db.log.clone(),
        },
    )
    .expect("valid consumer settings");
    let consumer = tokio::spawn(consumer.run(stop.clone()));

    let before: Vec<NewEvent> = (0..30).map(|n| event(&format!("k{}", n % 3), n)).collect();
    OutboxWriter::enqueue(&*db.store, &before).await.unwrap();
    db.wait_for_effects(30, DEADLINE).await;

    own.stop();
    let during: Vec<NewEvent> = (30..60).map(|n| event(&format!("k{}", n % 3), n)).collect();
    OutboxWriter::enqueue(&*db.store, &during).await.unwrap();
    within(
        "the relay to meet the outage twice",
        watch.wait_for_outages(2),
    )
    .await;
    own.restart();
    db.wait_for_effects(60, DEADLINE).await;

    let report = relays.stop(DEADLINE).await;
    stop.cancel();
    consumer.await.unwrap().unwrap();
    assert!(report.outages >= 2, "{report:?}");
    let all: Vec<NewEvent> = before.into_iter().chain(during).collect();
    let mut burned = Vec::new();
    for e in &all {
        let history = db.store.history(e.event_id).await.unwrap();
        if !history.is_empty() {
            burned.push((e.event_id, history));
        }
    }
    // The attempts' errors say which path took them, should this fail.
    assert!(
        burned.is_empty(),
        "{report:?}, attempts burned: {burned:#?}"
    );
    assert_eq!((report.retried, report.failed), (0, 0), "{report:?}");
    assert_exactly_once_in_key_order(&db.effects().await, &all);
    let _ = RecordingPublisher::new();
}

fn quick_store_outage() -> OutagePolicy {
    OutagePolicy {
        initial_pause: Duration::from_millis(1),
        max_pause: Duration::from_millis(10),
    }
}

/// The inbox's database fails every few operations (as at a restart or a
/// pool timeout): the consumer waits each failure out on the same entry,
/// never exits, never skips or dead-letters, and keeps each key's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_rides_out_inbox_store_outages_in_key_order() {
    let db = database().await;
    let prefix = support::prefix();
    let events = events_over_keys(200, 10);
    OutboxWriter::enqueue(&*db.store, &events).await.unwrap();
    let publisher = Arc::new(RedisPublisher::new(
        support::connect(support::REDIS_URL).await,
        StreamRouter::with_prefix(&prefix),
    ));
    let relays = RelayFleet::spawn(db.store.clone(), publisher, "relay", 2);
    let flaky = FlakyInbox::new(db.store.inbox(), 5);
    let injected = flaky.injected.clone();
    let mut config = consumer_config(&prefix, "c1");
    // One handler attempt: a store error counted against the handler would
    // dead-letter the entry at once.
    config.handler_retry = RetryPolicy::immediate(1);
    config.store_outage = quick_store_outage();
    let stop = CancellationToken::new();
    let consumer = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        config,
        flaky,
        RecordEffect {
            log: db.log.clone(),
        },
    )
    .expect("valid consumer settings");
    let consumer = tokio::spawn(consumer.run(stop.clone()));
    db.wait_for_effects(events.len(), DEADLINE).await;
    relays.stop(DEADLINE).await;
    stop.cancel();
    let report = within("consumer shutdown", consumer)
        .await
        .unwrap()
        .expect("a retryable store error never ends the consumer");
    let injected = injected.load(AtomicOrdering::SeqCst) as u64;
    assert!(injected >= 40, "faults injected: {injected}");
    assert_eq!(report.store_retries, injected, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert_exactly_once_in_key_order(&db.effects().await, &events);
}

/// Records the effect, and on chosen calls drops every client connection of
/// the (private) Redis server: a broker blip while a batch is in hand.
struct BlipMidBatch {
    log: EffectLog,
    redis_url: String,
    calls: AtomicUsize,
    blip_at: Vec<usize>,
}

#[async_trait]
impl Handler<Transaction<'static, Postgres>, StreamEvent> for BlipMidBatch {
    async fn handle(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        event: &StreamEvent,
    ) -> Result<(), HandlerError> {
        self.log
            .record(tx, &event.partition_key, event.event_id)
            .await
            .map_err(|e| HandlerError::Retry(e.to_string()))?;
        let call = self.calls.fetch_add(1, AtomicOrdering::SeqCst) + 1;
        if self.blip_at.contains(&call) {
            let client = redis::Client::open(self.redis_url.as_str()).unwrap();
            let mut killer = client.get_multiplexed_async_connection().await.unwrap();
            let killed: i64 = redis::cmd("CLIENT")
                .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
                .query_async(&mut killer)
                .await
                .unwrap();
            assert!(killed >= 1, "the consumer's connection was dropped");
        }
        Ok(())
    }
}

/// The consumer's connection drops twice in the middle of a 64-entry batch.
/// The consumer never dies, so nothing excuses a reordering: it finishes the
/// rest of each cut batch (its own pending entries) before any newer entry,
/// and each key's events reach the handler in stream order, each once. (It
/// used to read only new entries after the error and get the cut batch's
/// rest back by reclaim, behind newer ones.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_blip_mid_batch_keeps_key_order_for_a_live_consumer() {
    let db = database().await;
    let prefix = support::prefix();
    let own = PrivateRedis::start();
    let events = events_over_keys(300, 3);
    OutboxWriter::enqueue(&*db.store, &events).await.unwrap();
    let publisher = Arc::new(RedisPublisher::new(
        support::connect(&own.url()).await,
        StreamRouter::with_prefix(&prefix),
    ));
    let relays = RelayFleet::spawn(db.store.clone(), publisher, "relay", 1);
    let stream = format!("{prefix}invoice.paid");
    let mut probe = support::connect(&own.url()).await;
    within("the stream to hold every event", async {
        loop {
            let len: usize = redis::AsyncCommands::xlen(&mut probe, &stream)
                .await
                .unwrap();
            if len == events.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    relays.stop(DEADLINE).await;

    let mut config = consumer_config(&prefix, "c1");
    // Reclaim would only hide the fault: it is for consumers that died.
    config.reclaim_idle = Duration::from_secs(30);
    config.store_outage = quick_store_outage();
    let stop = CancellationToken::new();
    let consumer = RedisConsumer::new(
        support::connect(&own.url()).await,
        config,
        db.store.inbox(),
        BlipMidBatch {
            log: db.log.clone(),
            redis_url: own.url(),
            calls: AtomicUsize::new(0),
            blip_at: vec![20, 150],
        },
    )
    .expect("valid consumer settings");
    let consumer = tokio::spawn(consumer.run(stop.clone()));
    db.wait_for_effects(events.len(), DEADLINE).await;
    stop.cancel();
    let report = within("consumer shutdown", consumer)
        .await
        .unwrap()
        .unwrap();
    assert!(
        report.broker.redis_retries >= 2,
        "both blips hit the consumer: {report:?}"
    );
    assert_exactly_once_in_key_order(&db.effects().await, &events);
}

/// Settings that cannot work are refused when the consumer is built, with
/// a typed error, instead of looping at run time.
#[tokio::test]
async fn consumer_settings_that_cannot_work_are_refused() {
    let connection = support::connect(support::REDIS_URL).await;
    let base = || ConsumerConfig::new("g", "c", vec!["s".into()]);
    let cases: Vec<(&str, ConsumerConfig)> = vec![
        (
            "batch_size",
            ConsumerConfig {
                batch_size: 0,
                ..base()
            },
        ),
        (
            "apply_batch",
            ConsumerConfig {
                apply_batch: 0,
                ..base()
            },
        ),
        (
            "block",
            ConsumerConfig {
                block: Duration::ZERO,
                ..base()
            },
        ),
        (
            "reclaim_idle",
            ConsumerConfig {
                reclaim_idle: Duration::ZERO,
                ..base()
            },
        ),
        (
            "max_deliveries",
            ConsumerConfig {
                max_deliveries: 0,
                ..base()
            },
        ),
        (
            "stream",
            ConsumerConfig {
                streams: vec![],
                ..base()
            },
        ),
        (
            "group",
            ConsumerConfig {
                group: String::new(),
                ..base()
            },
        ),
        (
            "dead_letter_suffix",
            ConsumerConfig {
                dead_letter_suffix: String::new(),
                ..base()
            },
        ),
        (
            "retry.max_attempts",
            ConsumerConfig {
                handler_retry: RetryPolicy::immediate(0),
                ..base()
            },
        ),
    ];
    for (field, config) in cases {
        let built = RedisConsumer::new(
            connection.clone(),
            config,
            outbox_core::memory::MemoryInbox::new(),
            NeverCalled,
        );
        match built {
            Err(ConsumerError::Config(message)) => {
                assert!(message.contains(field), "{field}: {message}")
            }
            Err(other) => panic!("{field}: wrong error {other}"),
            Ok(_) => panic!("{field}: accepted"),
        }
    }
}

struct NeverCalled;

#[async_trait]
impl Handler<outbox_core::memory::MemoryInboxTx, StreamEvent> for NeverCalled {
    async fn handle(
        &self,
        _: &mut outbox_core::memory::MemoryInboxTx,
        _: &StreamEvent,
    ) -> Result<(), HandlerError> {
        unreachable!("never run")
    }
}
