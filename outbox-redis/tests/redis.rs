//! The publisher and inbox suites and Redis-specific checks, against the
//! live Redis on 127.0.0.1:6379 (and servers of the tests' own for faults).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::testing::{
    InboxHarness, PublisherHarness, ReceivedEvent, event, inbox_suite, publisher_suite,
};
use outbox_core::{ErrorClass, EventId, ManualClock, Publisher, StoreError, StoredEvent};
use outbox_redis::{RedisInbox, RedisInboxTx, RedisPublisher, StreamEvent, StreamRouter};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use redis::streams::StreamRangeReply;

fn stored(events: Vec<outbox_core::NewEvent>) -> Vec<StoredEvent> {
    let now = chrono::Utc::now();
    events
        .into_iter()
        .enumerate()
        .map(|(i, event)| StoredEvent {
            sequence: i as i64 + 1,
            event,
            created_at: now,
            available_at: now,
            attempts: 0,
        })
        .collect()
}

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

async fn read_stream(connection: &mut ConnectionManager, stream: &str) -> Vec<StreamEvent> {
    let reply: StreamRangeReply = connection.xrange_all(stream).await.unwrap();
    reply
        .ids
        .iter()
        .map(|e| StreamEvent::decode(stream, &e.id, &e.map).unwrap())
        .collect()
}

#[async_trait]
impl PublisherHarness for Harness {
    type Publisher = RedisPublisher;
    fn publisher(&self) -> Arc<RedisPublisher> {
        self.publisher.clone()
    }
    async fn read_back(&self, n: usize) -> Vec<ReceivedEvent> {
        let start = *self.read.lock().unwrap();
        let entries = read_stream(&mut self.connection.clone(), &self.stream).await;
        assert!(entries.len() >= start + n, "only {} entries", entries.len());
        *self.read.lock().unwrap() = start + n;
        entries[start..start + n]
            .iter()
            .map(|e| {
                let mut headers: Vec<(String, String)> = e
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                headers.sort();
                ReceivedEvent {
                    event_id: e.event_id,
                    event_type: e.event_type.clone(),
                    partition_key: e.partition_key.clone(),
                    payload: e.payload.clone(),
                    headers,
                }
            })
            .collect()
    }
}

#[tokio::test]
async fn publisher_round_trips_every_field() {
    publisher_suite::round_trips_every_field(&Harness::new().await).await;
}

#[tokio::test]
async fn publisher_keeps_order_within_a_key() {
    publisher_suite::keeps_order_within_a_key(&Harness::new().await).await;
}

#[tokio::test]
async fn publisher_empty_batch_is_a_noop() {
    publisher_suite::empty_batch_is_a_noop(&Harness::new().await).await;
}

#[tokio::test]
async fn wrong_type_is_permanent_for_that_event_only() {
    let harness = Harness::new().await;
    let mut connection = harness.connection.clone();
    let blocked = harness.publisher.stream_for("invoice.refunded");
    let _: () = connection.set(&blocked, "not a stream").await.unwrap();
    let mut refund = event("a", 1);
    refund.event_type = "invoice.refunded".into();
    let events = stored(vec![event("a", 0), refund, event("a", 2)]);
    let refs: Vec<&StoredEvent> = events.iter().collect();
    let outcomes = harness.publisher.publish(&refs).await;
    assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
    let err = outcomes[1].as_ref().unwrap_err();
    assert_eq!(err.class, ErrorClass::Permanent, "{err}");
    assert!(err.message.contains("WRONGTYPE"), "{err}");
}

#[tokio::test]
async fn out_of_memory_is_permanent() {
    let own = support::OwnRedis::start().await;
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
    assert_eq!(err.class, ErrorClass::Permanent, "{err}");
    assert!(err.message.contains("OOM"), "{err}");
}

#[tokio::test]
async fn unreachable_server_is_an_outage() {
    let mut own = support::OwnRedis::start().await;
    let connection = support::connect(&own.url()).await;
    own.stop().await;
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
