//! The publisher suite and Kafka-specific checks against the loopback broker
//! started by `scripts/kafka.sh` (`OUTBOX_KAFKA_BOOTSTRAP`, default
//! 127.0.0.1:19092). Each test has topics of its own.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::memory::MemoryStore;
use outbox_core::testing::{
    OutageCounter, PublisherHarness, ReceivedEvent, event, events_over_keys, relay_suite,
};
use outbox_core::{
    CancellationToken, ErrorClass, EventId, ManualClock, OutboxWriter, Publisher, Relay,
    StoredEvent,
};
use outbox_kafka::{KafkaPublisher, KafkaPublisherConfig, TopicRouter, headers};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

const PARTITIONS: i32 = 4;

fn bootstrap() -> String {
    std::env::var("OUTBOX_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:19092".into())
}

fn prefix() -> String {
    format!("t{}.", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// Creates `topic` with four partitions; an unreachable broker fails the test.
async fn create_topic(topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "Kafka broker unreachable at {}: {e} (scripts/kafka.sh starts it)",
                bootstrap()
            )
        });
    for result in results {
        result.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
}

/// Reads a topic from the beginning of every partition (no group join).
fn reader(topic: &str) -> StreamConsumer {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", format!("reader-{topic}"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        assignment
            .add_partition_offset(topic, partition, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    consumer
}

fn received(message: &rdkafka::message::BorrowedMessage<'_>) -> ReceivedEvent {
    let pairs = message.headers().into_iter().flat_map(|h| {
        h.iter()
            .map(|header| {
                let value = String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned();
                (header.key.to_owned(), value)
            })
            .collect::<Vec<_>>()
    });
    let (envelope, headers) = ReceivedEvent::split_envelope(pairs);
    let named = |name: &str| {
        envelope
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} header"))
    };
    ReceivedEvent {
        event_id: named(headers::names::EVENT_ID).parse::<EventId>().unwrap(),
        event_type: named(headers::names::EVENT_TYPE),
        partition_key: String::from_utf8(message.key().unwrap().to_vec()).unwrap(),
        payload: message.payload().unwrap_or_default().to_vec(),
        headers,
        envelope,
    }
}

async fn read(consumer: &StreamConsumer, n: usize) -> Vec<ReceivedEvent> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} messages arrived", out.len()))
            .unwrap();
        out.push(received(&message));
    }
    out
}

struct Harness {
    publisher: Arc<KafkaPublisher>,
    consumer: StreamConsumer,
}

impl Harness {
    async fn new() -> Self {
        let prefix = prefix();
        let router = TopicRouter::with_prefix(&prefix);
        let topic = router.topic_for("invoice.paid");
        create_topic(&topic).await;
        let publisher =
            KafkaPublisher::new(&KafkaPublisherConfig::new(bootstrap()), router).unwrap();
        Self {
            publisher: Arc::new(publisher),
            consumer: reader(&topic),
        }
    }
}

#[async_trait]
impl PublisherHarness for Harness {
    type Publisher = KafkaPublisher;
    fn publisher(&self) -> Arc<KafkaPublisher> {
        self.publisher.clone()
    }
    async fn read_back(&self, n: usize) -> Vec<ReceivedEvent> {
        read(&self.consumer, n).await
    }
    async fn unreachable_publisher(&self) -> Arc<KafkaPublisher> {
        // A closed port: no broker ever answers.
        let config = KafkaPublisherConfig::new("127.0.0.1:9");
        Arc::new(KafkaPublisher::new(&config, TopicRouter::with_prefix("down.")).unwrap())
    }
}

use outbox_core::testing::stored;

mod dead_letters;

mod publisher {
    use super::*;
    outbox_core::publisher_conformance_tests!(Harness::new().await);
}

/// A message over the producer's `message.max.bytes` is permanent for that
/// event; the rest of the batch is delivered.
#[tokio::test]
async fn an_oversized_message_is_permanent_and_the_rest_flows() {
    let harness = Harness::new().await;
    let mut huge = event("a", 1);
    huge.payload = outbox_core::Payload::from_serialize(&"x".repeat(2_000_000)).unwrap();
    let events = stored(vec![event("a", 0), huge, event("b", 2)]);
    let refs: Vec<&StoredEvent> = events.iter().collect();
    let outcomes = harness.publisher.publish(&refs).await;
    assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
    let err = outcomes[1].as_ref().unwrap_err();
    assert_eq!(err.class, ErrorClass::Permanent, "{err}");
    let got = harness.read_back(2).await;
    let ids: std::collections::HashSet<_> = got.iter().map(|r| r.event_id).collect();
    assert!(ids.contains(&events[0].event_id) && ids.contains(&events[2].event_id));
}

/// A key stops at its first failure within a call: the key's later event
/// is reported failed and never delivered, while the other key flows. The
/// key's next event, sent afterwards, is the first one after its head.
#[tokio::test]
async fn a_failed_event_holds_back_the_rest_of_its_key_only() {
    let harness = Harness::new().await;
    let mut huge = event("a", 1);
    huge.payload = outbox_core::Payload::from_serialize(&"x".repeat(2_000_000)).unwrap();
    let events = stored(vec![
        event("a", 0),
        huge,
        event("a", 2),
        event("b", 3),
        event("a", 4),
    ]);
    let call: Vec<&StoredEvent> = events[..4].iter().collect();
    let outcomes = harness.publisher.publish(&call).await;
    assert!(outcomes[0].is_ok() && outcomes[3].is_ok(), "{outcomes:?}");
    assert_eq!(
        outcomes[1].as_ref().unwrap_err().class,
        ErrorClass::Permanent
    );
    assert!(outcomes[2].is_err(), "a2 must be held back: {outcomes:?}");
    assert!(harness.publisher.publish(&[&events[4]]).await[0].is_ok());
    // Key a's partition holds a0 then a4: had a2 been delivered it would
    // sit between them, and three messages could not include a4.
    let got = harness.read_back(3).await;
    let key_a: Vec<_> = got
        .iter()
        .filter(|r| r.partition_key == "a")
        .map(|r| r.event_id)
        .collect();
    assert_eq!(key_a, vec![events[0].event_id, events[4].event_id]);
    assert!(got.iter().any(|r| r.event_id == events[3].event_id));
}

/// A key's events bound for two topics: the run for the second topic waits
/// for the first, and a failure in the first holds it back undelivered.
#[tokio::test]
async fn a_keys_run_to_another_topic_waits_for_the_run_before_it() {
    let prefix = prefix();
    let router = TopicRouter::with_prefix(&prefix);
    let paid = router.topic_for("invoice.paid");
    let voided = router.topic_for("invoice.voided");
    create_topic(&paid).await;
    create_topic(&voided).await;
    let publisher = KafkaPublisher::new(&KafkaPublisherConfig::new(bootstrap()), router).unwrap();
    let voided_event = |key: &str, n: usize| {
        let mut e = event(key, n);
        e.event_type = "invoice.voided".into();
        e
    };
    let mut huge = event("a", 0);
    huge.payload = outbox_core::Payload::from_serialize(&"x".repeat(2_000_000)).unwrap();
    let events = stored(vec![
        huge,
        voided_event("a", 1),
        voided_event("b", 2),
        event("c", 3),
        voided_event("c", 4),
        voided_event("a", 5),
    ]);
    let call: Vec<&StoredEvent> = events[..5].iter().collect();
    let outcomes = publisher.publish(&call).await;
    assert_eq!(
        outcomes[0].as_ref().unwrap_err().class,
        ErrorClass::Permanent
    );
    assert!(outcomes[1].is_err(), "a1 must be held back: {outcomes:?}");
    assert!(outcomes[2..].iter().all(Result::is_ok), "{outcomes:?}");
    assert!(publisher.publish(&[&events[5]]).await[0].is_ok());
    let on_voided = read(&reader(&voided), 3).await;
    let key_a: Vec<_> = on_voided
        .iter()
        .filter(|r| r.partition_key == "a")
        .map(|r| r.event_id)
        .collect();
    assert_eq!(key_a, vec![events[5].event_id], "a1 was never delivered");
    let on_paid = read(&reader(&paid), 1).await;
    assert_eq!(on_paid[0].event_id, events[3].event_id);
}

/// No broker at all: deliveries time out while every broker is down, an outage.
#[tokio::test]
async fn an_unreachable_broker_is_an_outage() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = closed.local_addr().unwrap();
    drop(closed);
    let mut config = KafkaPublisherConfig::new(address.to_string());
    config.delivery_timeout = Duration::from_millis(1500);
    let publisher = KafkaPublisher::new(&config, TopicRouter::with_prefix(prefix())).unwrap();
    let events = stored(vec![event("a", 1)]);
    let outcomes = publisher.publish(&[&events[0]]).await;
    assert_eq!(
        outcomes[0].as_ref().unwrap_err().class,
        ErrorClass::Outage,
        "{outcomes:?}"
    );
}

/// Four relays over one store publish 400 events on 20 keys to a topic of
/// four partitions; read back, each key is in enqueue order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_keep_key_order_on_the_topic() {
    let harness = Harness::new().await;
    let store = Arc::new(MemoryStore::with_clock(Arc::new(ManualClock::at_epoch())));
    let events = events_over_keys(400, 20);
    store.enqueue(&events).await.unwrap();
    let shutdown = CancellationToken::new();
    let relays: Vec<_> = (0..4)
        .map(|r| {
            Relay::new(
                store.clone(),
                harness.publisher.clone(),
                relay_suite::config(&format!("k{r}")),
            )
            .unwrap()
            .spawn(shutdown.clone())
        })
        .collect();
    let got = harness.read_back(400).await;
    shutdown.cancel();
    let mut published = 0;
    for relay in relays {
        published += relay.await.unwrap().unwrap().published;
    }
    assert_eq!(published, 400);
    for key in (0..20).map(|k| format!("k{k}")) {
        let sent: Vec<_> = events
            .iter()
            .filter(|e| e.partition_key == key)
            .map(|e| e.event_id)
            .collect();
        let seen: Vec<_> = got
            .iter()
            .filter(|r| r.partition_key == key)
            .map(|r| r.event_id)
            .collect();
        assert_eq!(seen, sent, "key {key}");
    }
}

/// (d) Through a relay: an event too large for the broker ends in `failed`
/// (permanent, alert fired), and the rest, its own key included, flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_event_fails_and_the_rest_flows_through_the_relay() {
    let harness = Harness::new().await;
    let limits = outbox_core::EventLimits {
        max_payload_bytes: 4_000_000,
        ..Default::default()
    };
    let store =
        Arc::new(MemoryStore::with_clock(Arc::new(ManualClock::at_epoch())).with_limits(limits));
    let mut huge = event("a", 1);
    huge.payload = outbox_core::Payload::from_serialize(&"x".repeat(2_000_000)).unwrap();
    let events = vec![event("a", 0), huge.clone(), event("a", 2), event("b", 3)];
    store.enqueue(&events).await.unwrap();
    let (alerts, mut alerted) = tokio::sync::mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let relay = Relay::new(
        store.clone(),
        harness.publisher.clone(),
        relay_suite::config("big"),
    )
    .unwrap()
    .with_alert_hook(move |a: &outbox_core::relay::FailedAlert| {
        let _ = alerts.send(a.event.event_id);
    })
    .spawn(shutdown.clone());
    let got = harness.read_back(3).await;
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(30), alerted.recv())
            .await
            .unwrap(),
        Some(huge.event_id)
    );
    shutdown.cancel();
    let report = relay.await.unwrap().unwrap();
    assert_eq!((report.published, report.failed), (3, 1));
    let key_a: Vec<_> = got
        .iter()
        .filter(|r| r.partition_key == "a")
        .map(|r| r.event_id)
        .collect();
    assert_eq!(key_a, vec![events[0].event_id, events[2].event_id]);
    let history = outbox_core::OutboxAdmin::history(&*store, huge.event_id)
        .await
        .unwrap();
    assert_eq!(
        history[0].kind,
        outbox_core::store::AttemptKind::PermanentFailure
    );
}

/// A consumer that gets partitions back at an older committed offset (here:
/// another member joins and leaves the group before the first commit; in
/// the issue, a lost session) resumes at its own position: nothing it
/// applied reaches its handler or inbox again, and what follows is applied.
/// It used to restart from the committed offset (626 redeliveries to itself
/// in the run, absorbed by the inbox).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_handed_back_behind_resumes_at_the_consumers_own_position() {
    use std::sync::Mutex;

    use outbox_core::memory::{MemoryInbox, MemoryInboxTx};
    use outbox_kafka::{Handler, HandlerError, KafkaConsumer, KafkaConsumerConfig, KafkaEvent};

    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<EventId>>>);
    #[async_trait]
    impl Handler<MemoryInboxTx, KafkaEvent> for Seen {
        async fn handle(
            &self,
            _tx: &mut MemoryInboxTx,
            event: &KafkaEvent,
        ) -> Result<(), HandlerError> {
            self.0.lock().unwrap().push(event.event_id);
            Ok(())
        }
    }
    async fn seen_reaches(seen: &Seen, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while seen.0.lock().unwrap().len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{n} handled within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let harness = Harness::new().await;
    let topic = harness.publisher.topic_for("invoice.paid");
    let group = format!("resume-{topic}");
    let publish = async |events: &[StoredEvent]| {
        let refs: Vec<&StoredEvent> = events.iter().collect();
        let outcomes = harness.publisher.publish(&refs).await;
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    };
    let first = stored(events_over_keys(12, 4));
    publish(&first).await;
    let mut config = KafkaConsumerConfig::new(bootstrap(), group.clone(), vec![topic.clone()]);
    // Nothing committed before the rebalance: the group's offset is the
    // start of each partition, behind everything the consumer applied.
    config.commit_interval = Duration::from_secs(600);
    config
        .librdkafka
        .push(("session.timeout.ms".into(), "6000".into()));
    let seen = Seen::default();
    let consumer = KafkaConsumer::new(config, MemoryInbox::new(), seen.clone()).unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(consumer.run(stop.clone()));
    seen_reaches(&seen, first.len()).await;

    // Another member joins (a rebalance takes partitions away), then leaves
    // (they come back, at the group's committed offset).
    let other: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        .create()
        .unwrap();
    other.subscribe(&[&topic]).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while other.assignment().unwrap().count() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the other member joined within 60 s"
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), other.recv()).await;
    }
    other.unsubscribe();
    drop(other);

    let second = stored((12..18).map(|n| event(&format!("k{}", n % 4), n)).collect());
    publish(&second).await;
    seen_reaches(&seen, first.len() + second.len()).await;
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let handled = seen.0.lock().unwrap().clone();
    let expected: Vec<EventId> = first.iter().chain(&second).map(|e| e.event_id).collect();
    let mut sorted = handled.clone();
    sorted.sort();
    let mut wanted = expected.clone();
    wanted.sort();
    assert_eq!(sorted, wanted, "each event handled once");
    assert_eq!(
        report.duplicates, 0,
        "nothing redelivered to the inbox: {report:?}"
    );
    assert!(
        report.broker.resumed >= 1,
        "a partition came back behind: {report:?}"
    );
    assert_eq!(report.applied, 18, "{report:?}");
}

/// A topic that does not exist is the destination's configuration, not the
/// events' fault: the relay pauses on it as an outage, fails nothing and
/// burns no attempt, and publishes everything once the topic is created.
/// (It used to spend three transient attempts per event, then fail each
/// one as permanent: the whole backlog dead-lettered.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_pauses_the_relay_until_it_exists() {
    let router = TopicRouter::with_prefix(prefix());
    let topic = router.topic_for("invoice.paid");
    // tansu creates topics on demand; a client that asks it not to sees what
    // a broker with auto-create off answers.
    let mut config =
        KafkaPublisherConfig::new(bootstrap()).set("allow.auto.create.topics", "false");
    config.delivery_timeout = Duration::from_secs(2);
    let publisher = Arc::new(OutageCounter::new(
        KafkaPublisher::new(&config, router).unwrap(),
    ));
    let store = Arc::new(MemoryStore::with_clock(Arc::new(ManualClock::at_epoch())));
    let events = events_over_keys(30, 3);
    store.enqueue(&events).await.unwrap();
    let shutdown = CancellationToken::new();
    let relay = Relay::new(
        store.clone(),
        publisher.clone(),
        relay_suite::config("missing-topic"),
    )
    .unwrap()
    .spawn(shutdown.clone());
    tokio::time::timeout(Duration::from_secs(60), publisher.wait_for_outages(2))
        .await
        .expect("the missing topic is met as an outage, twice");
    for e in &events {
        assert!(
            outbox_core::OutboxAdmin::history(&*store, e.event_id)
                .await
                .unwrap()
                .is_empty(),
            "no attempt burned while the topic is missing"
        );
    }
    create_topic(&topic).await;
    let consumer = reader(&topic);
    let got = read(&consumer, events.len()).await;
    assert_eq!(got.len(), events.len());
    shutdown.cancel();
    let report = relay.await.unwrap().unwrap();
    assert_eq!((report.failed, report.retried), (0, 0), "{report:?}");
    assert!(report.outages >= 2, "{report:?}");
}

/// A topic name the broker refuses is configuration too: an outage, not a
/// permanent failure of the event.
#[tokio::test]
async fn an_invalid_topic_name_is_an_outage_not_a_failure() {
    let router = TopicRouter::with_prefix(prefix()).route("invoice.paid", "not a valid topic!");
    let mut config = KafkaPublisherConfig::new(bootstrap());
    config.delivery_timeout = Duration::from_secs(2);
    let publisher = KafkaPublisher::new(&config, router).unwrap();
    let events = stored(vec![event("a", 1)]);
    let outcomes = publisher.publish(&[&events[0]]).await;
    let error = outcomes[0].as_ref().unwrap_err();
    assert_eq!(error.class, ErrorClass::Outage, "{error}");
}

/// A bootstrap list librdkafka would accept and then retry forever (a port
/// that is not a number, a space, an empty entry) is refused when the
/// publisher or the consumer is built.
#[test]
fn a_malformed_bootstrap_list_is_refused_when_clients_are_built() {
    use outbox_core::memory::MemoryInbox;
    use outbox_kafka::{
        ConsumerError, HandlerError, KafkaConsumer, KafkaConsumerConfig, KafkaEvent,
    };

    struct Nothing;
    #[async_trait]
    impl outbox_kafka::Handler<outbox_core::memory::MemoryInboxTx, KafkaEvent> for Nothing {
        async fn handle(
            &self,
            _tx: &mut outbox_core::memory::MemoryInboxTx,
            _event: &KafkaEvent,
        ) -> Result<(), HandlerError> {
            Ok(())
        }
    }

    for bootstrap in ["127.0.0.1:notaport", "broker one:9092", "a:1,,b:2"] {
        let publisher = KafkaPublisher::new(
            &KafkaPublisherConfig::new(bootstrap),
            TopicRouter::with_prefix("t."),
        );
        let error = publisher
            .err()
            .unwrap_or_else(|| panic!("{bootstrap} accepted"));
        assert!(error.to_string().contains("bootstrap server"), "{error}");
        let consumer = KafkaConsumer::new(
            KafkaConsumerConfig::new(bootstrap, "group", vec!["t".into()]),
            MemoryInbox::new(),
            Nothing,
        );
        assert!(
            matches!(consumer, Err(ConsumerError::Config(ref m)) if m.contains("bootstrap server")),
            "{bootstrap}"
        );
    }
}
