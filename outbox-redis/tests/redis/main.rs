//! The publisher and inbox suites and Redis-specific checks, against the
//! live Redis on 127.0.0.1:6379 (and servers of the tests' own for faults).

#[path = "../support/mod.rs"]
mod support;

use outbox_redis::testing::PrivateRedis;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::testing::{
    InboxHarness, OutageCounter, PublisherHarness, ReceivedEvent, event, inbox_suite,
};
use outbox_core::{
    CancellationToken, ErrorClass, EventId, ManualClock, OutboxWriter, Publisher, Relay,
    StoreError, StoredEvent,
};
use outbox_redis::{RedisInbox, RedisInboxTx, RedisPublisher, StreamEvent, StreamRouter};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use redis::streams::StreamRangeReply;

use outbox_core::testing::stored;

/// Reads back what the publisher appended, from the start of each stream.
struct Harness {
    publisher: Arc<RedisPublisher>,
    connection: ConnectionManager,
    stream: String,
    read: Mutex<usize>,
}

impl Harness {
    async fn new() -> Self {
        let prefix = support::prefix();
        let connection = support::connect(support::REDIS_URL).await;
        let publisher = RedisPublisher::new(connection.clone(), StreamRouter::with_prefix(&prefix));
        Self {
            stream: publisher.stream_for("invoice.paid"),
            publisher: Arc::new(publisher),
            connection,
            read: Mutex::new(0),
        }
    }
}

#[async_trait]
impl PublisherHarness for Harness {
    type Publisher = RedisPublisher;
    fn publisher(&self) -> Arc<RedisPublisher> {
        self.publisher.clone()
    }
    async fn read_back(&self, n: usize) -> Vec<ReceivedEvent> {
        let start = *self.read.lock().unwrap();
        let reply: StreamRangeReply = self
            .connection
            .clone()
            .xrange_all(&self.stream)
            .await
            .unwrap();
        assert!(
            reply.ids.len() >= start + n,
            "only {} entries",
            reply.ids.len()
        );
        *self.read.lock().unwrap() = start + n;
        reply.ids[start..start + n]
            .iter()
            .map(|entry| {
                // The raw fields, by the names the entry carries them under.
                let text = |value: &redis::Value| match value {
                    redis::Value::BulkString(bytes) => bytes.clone(),
                    other => panic!("field value {other:?}"),
                };
                let pairs = entry
                    .map
                    .iter()
                    .filter(|(name, _)| *name != "payload")
                    .map(|(name, value)| (name.clone(), String::from_utf8(text(value)).unwrap()));
                let (envelope, headers) = ReceivedEvent::split_envelope(pairs);
                let decoded = StreamEvent::decode(&self.stream, &entry.id, &entry.map).unwrap();
                ReceivedEvent {
                    event_id: decoded.event_id,
                    event_type: decoded.event_type,
                    partition_key: decoded.partition_key,
                    payload: text(&entry.map["payload"]),
                    headers,
                    envelope,
                }
            })
            .collect()
    }
    async fn unreachable_publisher(&self) -> Arc<RedisPublisher> {
        // A closed port: connections are refused.
        Arc::new(
            RedisPublisher::from_url("redis://127.0.0.1:9", StreamRouter::with_prefix("down:"))
                .unwrap(),
        )
    }
}

mod publisher {
    use super::*;
    outbox_core::publisher_conformance_tests!(Harness::new().await);
}

/// A stream key that holds another type (someone's string) is the
/// destination's configuration, not the events' fault: the relay pauses on
/// it as an outage, fails nothing, burns no attempt, and publishes every
/// event once the key is fixed. (It used to fail each event as permanent.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_key_of_the_wrong_type_pauses_the_relay_until_fixed() {
    let harness = Harness::new().await;
    let mut connection = harness.connection.clone();
    let stream = harness.publisher.stream_for("invoice.paid");
    let _: () = connection.set(&stream, "not a stream").await.unwrap();
    let publisher = Arc::new(OutageCounter::new(harness.publisher.as_ref().clone()));
    let store = Arc::new(outbox_core::memory::MemoryStore::new());
    let events = outbox_core::testing::events_over_keys(20, 2);
    OutboxWriter::enqueue(&*store, &events).await.unwrap();
    let shutdown = CancellationToken::new();
    let relay = Relay::new(
        store.clone(),
        publisher.clone(),
        outbox_core::testing::relay_suite::config("wrong-type"),
    )
    .unwrap()
    .spawn(shutdown.clone());
    tokio::time::timeout(Duration::from_secs(30), publisher.wait_for_outages(2))
        .await
        .expect("the wrong key type is met as an outage, twice");
    for e in &events {
        let history = outbox_core::OutboxAdmin::history(&*store, e.event_id)
            .await
            .unwrap();
        assert!(history.is_empty(), "attempt burned: {history:?}");
    }
    let _: () = connection.del(&stream).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let len: usize = connection.xlen(&stream).await.unwrap_or(0);
            if len == events.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every event published once the key is fixed");
    shutdown.cancel();
    let report = relay.await.unwrap().unwrap();
    assert_eq!((report.failed, report.retried), (0, 0), "{report:?}");
    assert!(report.outages >= 2, "{report:?}");
}

/// A key's events go out in one call, and an `XADD` that fails holds back
/// the later events of its key (they are not appended, and come back as
/// not sent) while other keys' events are appended: k2 goes to a stream
/// key holding a string, so k3 must not reach the good stream before it.
#[tokio::test]
async fn a_failed_append_holds_back_the_rest_of_its_key_only() {
    let harness = Harness::new().await;
    let mut connection = harness.connection.clone();
    let broken = harness.publisher.stream_for("invoice.voided");
    let _: () = connection.set(&broken, "not a stream").await.unwrap();
    let mut voided = event("k", 2);
    voided.event_type = "invoice.voided".into();
    let events = stored(vec![event("k", 1), voided, event("k", 3), event("j", 1)]);
    let refs: Vec<&StoredEvent> = events.iter().collect();
    assert!(harness.publisher.capabilities().preserves_key_order);
    let outcomes = harness.publisher.publish(&refs).await;
    assert!(outcomes[0].is_ok() && outcomes[3].is_ok(), "{outcomes:?}");
    let failed = outcomes[1].as_ref().unwrap_err();
    assert!(failed.message.contains("WRONGTYPE"), "{failed}");
    assert_eq!(failed.class, ErrorClass::Outage);
    let held = outcomes[2].as_ref().unwrap_err();
    assert!(held.message.contains("not sent"), "{held}");
    let appended: Vec<_> = harness
        .read_back(2)
        .await
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    assert_eq!(appended, vec![events[0].event_id, events[3].event_id]);
    let len: usize = connection.xlen(&harness.stream).await.unwrap();
    assert_eq!(len, 2, "k3 was appended after k2 failed");
    let _: () = connection.del(&broken).await.unwrap();
}

/// A full server (maxmemory reached) refuses every write alike: an outage.
#[tokio::test]
async fn out_of_memory_is_an_outage() {
    let own = PrivateRedis::start();
    let mut connection = support::connect(&own.url()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async(&mut connection)
        .await
        .unwrap();
    let publisher = RedisPublisher::new(connection, StreamRouter::default());
    let events = stored(vec![event("a", 1)]);
    let outcomes = publisher.publish(&[&events[0]]).await;
    let err = outcomes[0].as_ref().unwrap_err();
    assert_eq!(err.class, ErrorClass::Outage, "{err}");
    assert!(err.message.contains("OOM"), "{err}");
}

#[tokio::test]
async fn unreachable_server_is_an_outage() {
    let mut own = PrivateRedis::start();
    let connection = support::connect(&own.url()).await;
    own.stop();
    let publisher = RedisPublisher::new(connection, StreamRouter::default());
    let events = stored(vec![event("a", 1), event("b", 1)]);
    let outcomes = publisher.publish(&[&events[0], &events[1]]).await;
    for outcome in outcomes {
        assert_eq!(outcome.unwrap_err().class, ErrorClass::Outage);
    }
}

/// The Redis inbox with effects that are Redis commands (`RPUSH` to a list).
struct RedisInboxHarness {
    inbox: RedisInbox,
    connection: ConnectionManager,
    prefix: String,
    clock: ManualClock,
}

#[async_trait]
impl InboxHarness for RedisInboxHarness {
    type Inbox = RedisInbox;
    fn inbox(&self) -> &RedisInbox {
        &self.inbox
    }
    async fn apply_effect(
        &self,
        tx: &mut RedisInboxTx,
        consumer: &str,
        event_id: EventId,
    ) -> Result<(), StoreError> {
        let list = format!("{}effects:{consumer}", self.prefix);
        tx.effect(["RPUSH", list.as_str(), event_id.to_string().as_str()]);
        Ok(())
    }
    async fn effects(&self, consumer: &str) -> Result<Vec<EventId>, StoreError> {
        let list = format!("{}effects:{consumer}", self.prefix);
        let ids: Vec<String> = self
            .connection
            .clone()
            .lrange(list, 0, -1)
            .await
            .map_err(StoreError::fatal)?;
        Ok(ids.iter().map(|id| id.parse().unwrap()).collect())
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

async fn redis_inbox() -> Arc<RedisInboxHarness> {
    let prefix = support::prefix();
    let connection = support::connect(support::REDIS_URL).await;
    Arc::new(RedisInboxHarness {
        inbox: RedisInbox::new(
            connection.clone(),
            format!("{prefix}inbox:"),
            Duration::from_secs(3600),
        ),
        connection,
        prefix,
        clock: ManualClock::at_epoch(),
    })
}

fn inbox_factory(
    _clock: ManualClock,
) -> futures::future::BoxFuture<'static, Arc<RedisInboxHarness>> {
    Box::pin(redis_inbox())
}

#[tokio::test]
async fn inbox_claims_once_per_consumer() {
    inbox_suite::claims_once_per_consumer(&inbox_factory).await;
}

#[tokio::test]
async fn inbox_rollback_drops_claim_and_effect() {
    inbox_suite::rollback_drops_claim_and_effect(&inbox_factory).await;
}

#[tokio::test]
async fn inbox_redeliveries_apply_once() {
    inbox_suite::redeliveries_apply_once(&inbox_factory).await;
}

#[tokio::test]
async fn inbox_concurrent_deliveries_apply_once() {
    inbox_suite::concurrent_deliveries_apply_once(&inbox_factory).await;
}

/// Retention is the claim's TTL: Redis expires it, there is nothing to purge.
#[tokio::test]
async fn inbox_claims_expire_after_the_dedup_window() {
    let harness = redis_inbox().await;
    let id = EventId::random();
    assert!(inbox_suite::deliver(&*harness, "c", id).await.unwrap());
    let key = format!("{}inbox:c:{id}", harness.prefix);
    let ttl: i64 = harness.connection.clone().ttl(&key).await.unwrap();
    assert!((3500..=3600).contains(&ttl), "ttl {ttl}");
}

mod dead_letters;

mod replaying_dead_letters;

/// `MAXLEN ~` trims a stream as entries are appended (approximately: Redis
/// drops whole macro nodes, so the length stays at or a little above the cap).
#[tokio::test]
async fn approximate_trimming_caps_the_stream() {
    let prefix = support::prefix();
    let mut connection = support::connect(support::REDIS_URL).await;
    let router = StreamRouter::with_prefix(&prefix);
    let stream = router.stream_for("invoice.paid");
    let publisher = RedisPublisher::new(connection.clone(), router)
        .with_trim(&stream, outbox_redis::Trim::MaxLen(100));
    let events = stored((0..1000).map(|n| event("a", n)).collect());
    for chunk in events.chunks(100) {
        let refs: Vec<&StoredEvent> = chunk.iter().collect();
        assert!(publisher.publish(&refs).await.iter().all(Result::is_ok));
    }
    let len: usize = connection.xlen(&stream).await.unwrap();
    assert!((100..1000).contains(&len), "stream length {len}");
}

/// A publisher built while Redis is down: construction needs no server,
/// publishing reports an outage (promptly, within the connect timeout)
/// until Redis is back, then publishes.
#[tokio::test]
async fn a_publisher_built_while_redis_is_down_reports_outages_until_it_is_back() {
    let mut own = PrivateRedis::start();
    own.stop();
    let publisher = RedisPublisher::from_url(&own.url(), StreamRouter::with_prefix("lazy:"))
        .expect("built without a server");
    let events = stored(vec![event("a", 1)]);
    let started = std::time::Instant::now();
    let outcomes = publisher.publish(&[&events[0]]).await;
    let error = outcomes[0].as_ref().unwrap_err();
    assert_eq!(error.class, ErrorClass::Outage, "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "refused within the connect timeout, took {:?}",
        started.elapsed()
    );
    own.restart();
    let outcomes = publisher.publish(&[&events[0]]).await;
    assert!(outcomes[0].is_ok(), "{outcomes:?}");
}

/// A connection that drops under a running publisher (the server killed):
/// every publish during the outage says so promptly and as an outage (the
/// relay pauses and burns no attempt), and the first publish after the
/// server is back succeeds. Before, each publish waited on the connection
/// manager's reconnect backoff for minutes and timed out, a transient
/// failure that burned an attempt.
#[tokio::test]
async fn a_dropped_connection_is_an_outage_at_once_and_recovery_is_prompt() {
    let mut own = PrivateRedis::start();
    let publisher = RedisPublisher::from_url(&own.url(), StreamRouter::with_prefix("drop:"))
        .expect("the URL parses");
    let events = stored(vec![event("a", 1), event("a", 2), event("a", 3)]);
    assert!(publisher.publish(&[&events[0]]).await[0].is_ok());
    own.kill();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let outcomes = publisher.publish(&[&events[1]]).await;
        let error = outcomes[0].as_ref().expect_err("the server is gone");
        assert_eq!(error.class, ErrorClass::Outage, "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "an outage is reported within the connect timeout, took {:?}",
            started.elapsed()
        );
    }
    own.restart();
    let started = std::time::Instant::now();
    let outcomes = publisher.publish(&[&events[2]]).await;
    assert!(outcomes[0].is_ok(), "{outcomes:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "published {:?} after the server came back",
        started.elapsed()
    );
}

/// A server that stops answering costs each publish at most the
/// publisher's call limit (connect plus response timeout), and the answer
/// is an outage: the relay pauses and burns no attempt. Twice: paused with
/// the connection open (swap, a stalled fork), and restarted then paused
/// before the publisher's reconnection finished (where the connection
/// manager's attempts and its pauses between them add up to more than the
/// limit: without the publisher's bound a call took 2.8 s against 0.7).
/// Once the server runs again the next publish goes through.
#[tokio::test]
async fn a_server_that_stops_answering_costs_a_publish_its_call_limit_at_most() {
    use outbox_redis::ConnectionSettings;

    let mut own = PrivateRedis::start();
    let settings = ConnectionSettings {
        connect_timeout: Duration::from_millis(300),
        response_timeout: Duration::from_millis(400),
        ..ConnectionSettings::default()
    };
    let limit = settings.connect_timeout + settings.response_timeout;
    let publisher =
        RedisPublisher::from_url_with(&own.url(), StreamRouter::with_prefix("stall:"), settings)
            .expect("the URL parses");
    let events = stored(vec![event("a", 1), event("a", 2), event("a", 3)]);
    assert!(publisher.publish(&[&events[0]]).await[0].is_ok());
    let stalled = async |publisher: &RedisPublisher, how: &str| {
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let outcomes = publisher.publish(&[&events[1], &events[2]]).await;
            let took = started.elapsed();
            for outcome in &outcomes {
                let error = outcome.as_ref().expect_err("the server does not answer");
                assert_eq!(error.class, ErrorClass::Outage, "{how}: {error}");
            }
            assert!(
                took < limit + Duration::from_millis(500),
                "{how}: a publish took {took:?}, its limit is {limit:?}"
            );
        }
    };
    let recovers = async |publisher: &RedisPublisher, how: &str| {
        let started = std::time::Instant::now();
        loop {
            let outcomes = publisher.publish(&[&events[1], &events[2]]).await;
            if outcomes.iter().all(|o| o.is_ok()) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{how}: still failing {:?} after the server resumed: {outcomes:?}",
                started.elapsed()
            );
        }
    };
    own.pause();
    stalled(&publisher, "paused, connection open").await;
    own.resume();
    recovers(&publisher, "paused, connection open").await;

    own.kill();
    own.restart();
    own.pause();
    stalled(&publisher, "restarted, paused before the reconnection").await;
    own.resume();
    recovers(&publisher, "restarted, paused before the reconnection").await;
}

/// A consumer built and started while Redis is down (a deploy during a
/// Redis restart): it waits the outage out and applies what is published
/// once the server is back. Before, building its connection manager never
/// finished against a refused port.
#[tokio::test]
async fn a_consumer_built_while_redis_is_down_applies_once_it_is_back() {
    use outbox_core::memory::{MemoryInbox, MemoryInboxTx};
    use outbox_redis::{ConsumerConfig, Handler, HandlerError, RedisConsumer};

    struct Applied(tokio::sync::mpsc::UnboundedSender<EventId>);

    #[async_trait]
    impl Handler<MemoryInboxTx, StreamEvent> for Applied {
        async fn handle(
            &self,
            _tx: &mut MemoryInboxTx,
            event: &StreamEvent,
        ) -> Result<(), HandlerError> {
            let _ = self.0.send(event.event_id);
            Ok(())
        }
    }

    let mut own = PrivateRedis::start();
    own.stop();
    let router = StreamRouter::with_prefix("back:");
    let stream = router.stream_for("invoice.paid");
    let mut config = ConsumerConfig::new("g", "c", vec![stream]);
    config.block = Duration::from_millis(50);
    let (applied, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let consumer =
        RedisConsumer::from_url(&own.url(), config, MemoryInbox::new(), Applied(applied))
            .expect("built without a server");
    let stop = CancellationToken::new();
    let run = tokio::spawn(consumer.run(stop.clone()));
    // The outage lasts 200 ms of the consumer's running (its first
    // connection is tried at once); `restart` blocks this thread, so the
    // consumer meets the refused port before it, not during it.
    tokio::time::sleep(Duration::from_millis(200)).await;

    own.restart();
    let publisher = RedisPublisher::from_url(&own.url(), router).unwrap();
    let events = stored(vec![event("a", 1)]);
    assert!(publisher.publish(&[&events[0]]).await[0].is_ok());
    let first = tokio::time::timeout(Duration::from_secs(20), seen.recv())
        .await
        .expect("applied within 20 s of the server coming back");
    assert_eq!(first, Some(events[0].event_id));
    stop.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.applied, 1);
    assert!(
        report.broker.redis_retries > 0,
        "it met the outage: {report:?}"
    );
}

/// A database index the server does not have is configuration: an outage,
/// reported at once rather than after minutes of waiting.
#[tokio::test]
async fn a_bad_database_index_is_an_outage_reported_at_once() {
    let publisher = RedisPublisher::from_url(
        &format!("{}/9999", support::REDIS_URL),
        StreamRouter::with_prefix(support::prefix()),
    )
    .expect("the URL parses");
    let events = stored(vec![event("a", 1)]);
    let started = std::time::Instant::now();
    let outcomes = publisher.publish(&[&events[0]]).await;
    let error = outcomes[0].as_ref().unwrap_err();
    assert_eq!(error.class, ErrorClass::Outage, "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
}

/// A malformed URL fails when the publisher is built, with the parse error.
#[test]
fn a_malformed_url_is_refused_when_the_publisher_is_built() {
    let built = RedisPublisher::from_url("redis://127.0.0.1:notaport", StreamRouter::default());
    assert!(built.is_err());
}
