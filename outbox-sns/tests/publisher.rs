//! The SNS publisher against the emulator (`scripts/sns.sh`): what reaches
//! a subscribed queue, request limits, and every error class through the
//! real SDK (faults injected by `support::proxy`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::memory::MemoryStore;
use outbox_core::testing::stored;
use outbox_core::testing::{
    OutageCounter, PublishGate, PublisherHarness, ReceivedEvent, publisher_suite, relay_suite,
};
use outbox_core::testing::{event, event_with_payload, events_over_keys};
use outbox_core::{
    ErrorClass, ManualClock, NewEvent, OutboxWriter, PublishOutcome, Publisher,
    PublisherCapabilities, Relay, StoredEvent,
};
use outbox_sns::attributes::{MAX_ATTRIBUTES, names};
use outbox_sns::{SnsPublisher, SqsEvent, TopicRouter};
use support::proxy::{FaultProxy, Reply};
use support::{Aws, received, sdk_config};
use tokio_util::sync::CancellationToken;

struct Harness {
    aws: Aws,
    queue_url: String,
    publisher: Arc<SnsPublisher>,
}

impl Harness {
    async fn new(fifo: bool) -> Self {
        let aws = Aws::connect().await;
        let subscribed = aws.topic_with_queue("pub", fifo, true).await;
        let publisher = SnsPublisher::new(&aws.config, TopicRouter::to(&subscribed.topic_arn));
        Self {
            aws,
            queue_url: subscribed.queue_url,
            publisher: Arc::new(publisher),
        }
    }
}

#[async_trait]
impl PublisherHarness for Harness {
    type Publisher = SnsPublisher;
    fn publisher(&self) -> Arc<SnsPublisher> {
        self.publisher.clone()
    }
    async fn read_back(&self, n: usize) -> Vec<ReceivedEvent> {
        self.aws
            .drain(&self.queue_url, n)
            .await
            .iter()
            .map(received)
            .collect()
    }
    async fn unreachable_publisher(&self) -> Arc<SnsPublisher> {
        // A closed port: the SDK's connections are refused.
        let config = sdk_config("http://127.0.0.1:9");
        Arc::new(SnsPublisher::new(
            &config,
            TopicRouter::to("arn:aws:sns:us-east-1:000000000000:down"),
        ))
    }
}

async fn publish(publisher: &SnsPublisher, events: &[StoredEvent]) -> Vec<PublishOutcome> {
    let refs: Vec<&StoredEvent> = events.iter().collect();
    publisher.publish(&refs).await
}

fn classes(outcomes: &[PublishOutcome]) -> Vec<Option<ErrorClass>> {
    outcomes
        .iter()
        .map(|o| o.as_ref().err().map(|e| e.class))
        .collect()
}

/// On a FIFO topic and queue (where a key's events arrive in the order
/// published).
mod publisher {
    use super::*;
    outbox_core::publisher_conformance_tests!(Harness::new(true).await);
}

/// The round trip on a standard topic too.
#[tokio::test]
async fn publisher_round_trips_every_field_on_a_standard_topic() {
    publisher_suite::round_trips_every_field(&Harness::new(false).await).await;
}

/// The relay must send a key's events in successive calls: entries of one
/// request fail independently and requests run concurrently.
#[test]
fn capabilities_tell_the_truth_about_key_order() {
    let config = sdk_config("http://127.0.0.1:9");
    let publisher = SnsPublisher::new(&config, TopicRouter::to("arn:aws:sns:us-east-1:1:t.fifo"));
    assert_eq!(
        publisher.capabilities(),
        PublisherCapabilities {
            max_batch: 100,
            preserves_key_order: false
        }
    );
}

fn with_headers(n: usize) -> NewEvent {
    let mut builder = NewEvent::builder("invoice.paid", "invoice", "inv-15")
        .event_id(outbox_core::EventId::random())
        .payload_json(r#"{"amount": 15}"#)
        .correlation_id("corr-15")
        .causation_id("cause-15")
        .traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    for i in 0..n - 3 {
        builder = builder.header(format!("x-tenant-{i:02}"), format!("value {i}"));
    }
    builder.build().unwrap()
}

/// SNS delivers at most 10 attributes: an event with 15 headers arrives
/// with 10, and every header reads back, raw and enveloped alike.
#[tokio::test]
async fn fifteen_headers_arrive_within_ten_attributes_and_none_is_lost() {
    let aws = Aws::connect().await;
    let topic = aws.create_topic(&support::unique("headers")).await;
    let raw_queue = aws.create_queue(&support::unique("headers-raw")).await;
    let enveloped_queue = aws.create_queue(&support::unique("headers-env")).await;
    aws.subscribe(&topic, &raw_queue, true).await;
    aws.subscribe(&topic, &enveloped_queue, false).await;
    let publisher = SnsPublisher::new(&aws.config, TopicRouter::to(&topic));
    let events = stored(vec![with_headers(15)]);
    assert_eq!(events[0].headers.iter().count(), 15);
    let outcomes = publish(&publisher, &events).await;
    assert!(outcomes[0].is_ok(), "{outcomes:?}");

    let raw = aws.drain(&raw_queue, 1).await;
    let attributes = raw[0].message_attributes().unwrap();
    assert_eq!(attributes.len(), MAX_ATTRIBUTES, "{attributes:?}");
    assert!(attributes.contains_key(names::PACKED_HEADERS));
    assert!(attributes.contains_key("traceparent"));
    assert_eq!(received(&raw[0]), ReceivedEvent::expected(&events[0]));

    let enveloped = aws.drain(&enveloped_queue, 1).await;
    assert!(
        enveloped[0]
            .message_attributes()
            .is_none_or(|a| a.is_empty()),
        "enveloped: the attributes are inside the body"
    );
    let decoded = SqsEvent::decode(&enveloped[0]).unwrap();
    assert_eq!(decoded.headers, events[0].headers);
    assert_eq!(received(&enveloped[0]), ReceivedEvent::expected(&events[0]));
}

/// 25 small events go out in three requests (at most 10 entries each);
/// three events of 100 KiB cannot share one 256 KiB request. The emulator
/// refuses a request over either limit, so success is the proof; the
/// proxy counts the requests.
#[tokio::test]
async fn requests_stay_within_ten_entries_and_256_kib() {
    let aws = Aws::connect().await;
    let subscribed = aws.topic_with_queue("limits", false, true).await;
    let proxy = FaultProxy::start(&support::endpoint()).await;
    let publisher = SnsPublisher::new(
        &sdk_config(&proxy.url()),
        TopicRouter::to(&subscribed.topic_arn),
    );

    let small = stored(events_over_keys(25, 25));
    let outcomes = publish(&publisher, &small).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(proxy.actions(), vec!["PublishBatch"; 3]);

    let big_payload = serde_json::json!({ "blob": "x".repeat(100 * 1024) });
    let big = stored(
        (0..3)
            .map(|n| event_with_payload("big", n, big_payload.clone()))
            .collect(),
    );
    let outcomes = publish(&publisher, &big).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(
        proxy.requests(),
        3 + 2,
        "two 100 KiB events per request at most"
    );
    assert_eq!(aws.drain(&subscribed.queue_url, 28).await.len(), 28);
}

/// An event over SNS's 256 KiB limit (attributes included) is permanent
/// for that event only; the rest of the batch is published.
#[tokio::test]
async fn an_oversized_event_is_permanent_and_the_rest_flows() {
    let harness = Harness::new(false).await;
    let mut huge = event("a", 1);
    huge.payload = outbox_core::Payload::from_serialize(&"x".repeat(262_000)).unwrap();
    let events = stored(vec![event("a", 0), huge, event("b", 2)]);
    let outcomes = publish(&harness.publisher, &events).await;
    assert_eq!(
        classes(&outcomes),
        vec![None, Some(ErrorClass::Permanent), None]
    );
    let message = &outcomes[1].as_ref().unwrap_err().message;
    assert!(message.contains("262144"), "{message}");
    let got = harness.read_back(2).await;
    let ids: std::collections::HashSet<_> = got.iter().map(|r| r.event_id).collect();
    assert!(ids.contains(&events[0].event_id) && ids.contains(&events[2].event_id));
}

/// Per-entry failures in SNS's answer are classified per event: an invalid
/// entry is permanent, a server-side entry failure transient, a KMS key
/// disabled (configuration) an outage; the successful entry is `Ok`.
#[tokio::test]
async fn entry_failures_are_classified_per_event() {
    let proxy = FaultProxy::start(&support::endpoint()).await;
    let publisher = SnsPublisher::new(
        &sdk_config(&proxy.url()),
        TopicRouter::to(Aws::topic_arn("never-reached")),
    );
    proxy.then(Reply::publish_batch(
        &["0"],
        &[
            ("1", "InvalidParameter", true),
            ("2", "InternalError", false),
            ("3", "KMSDisabled", true),
        ],
    ));
    let events = stored((0..4).map(|n| event(&format!("k{n}"), n)).collect());
    let outcomes = publish(&publisher, &events).await;
    assert_eq!(
        classes(&outcomes),
        vec![
            None,
            Some(ErrorClass::Permanent),
            Some(ErrorClass::Transient),
            Some(ErrorClass::Outage)
        ]
    );
}

/// A request refused as invalid as a whole (which entry is at fault is not
/// said) is sent again one entry at a time, so no good event fails with it.
#[tokio::test]
async fn a_request_refused_as_a_whole_is_retried_entry_by_entry() {
    let aws = Aws::connect().await;
    let subscribed = aws.topic_with_queue("split", false, true).await;
    let proxy = FaultProxy::start(&support::endpoint()).await;
    let publisher = SnsPublisher::new(
        &sdk_config(&proxy.url()),
        TopicRouter::to(&subscribed.topic_arn),
    );
    proxy.then(Reply::sns_error(400, "InvalidParameter"));
    let events = stored((0..3).map(|n| event(&format!("k{n}"), n)).collect());
    let outcomes = publish(&publisher, &events).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(proxy.requests(), 1 + 3);
    assert_eq!(aws.drain(&subscribed.queue_url, 3).await.len(), 3);
}

/// Whole-request failures through the real SDK: throttling and 5xx are
/// transient; authorization, a missing topic and a disabled KMS key are
/// configuration (outage); a lone invalid entry is permanent.
#[tokio::test]
async fn request_errors_map_to_their_classes() {
    let proxy = FaultProxy::start(&support::endpoint()).await;
    let publisher = SnsPublisher::new(
        &sdk_config(&proxy.url()),
        TopicRouter::to(Aws::topic_arn("never-reached")),
    );
    let cases = [
        (Reply::sns_error(400, "Throttling"), ErrorClass::Transient),
        (Reply::sns_error(400, "Throttled"), ErrorClass::Transient),
        (
            Reply::sns_error(500, "InternalError"),
            ErrorClass::Transient,
        ),
        (
            Reply::sns_error(503, "ServiceUnavailable"),
            ErrorClass::Transient,
        ),
        (
            Reply::sns_error(403, "AuthorizationError"),
            ErrorClass::Outage,
        ),
        (Reply::sns_error(404, "NotFound"), ErrorClass::Outage),
        (Reply::sns_error(400, "KMSDisabled"), ErrorClass::Outage),
        (
            Reply::sns_error(403, "InvalidClientTokenId"),
            ErrorClass::Outage,
        ),
        (
            Reply::sns_error(400, "InvalidParameter"),
            ErrorClass::Permanent,
        ),
    ];
    let events = stored(vec![event("a", 1)]);
    for (reply, expected) in cases {
        let label = format!("{reply:?}");
        proxy.then(reply);
        let outcomes = publish(&publisher, &events).await;
        assert_eq!(classes(&outcomes), vec![Some(expected)], "{label}");
    }
}

/// Nothing listening, or an endpoint that never answers (past the SDK's
/// timeout): the broker is unreachable, an outage.
#[tokio::test]
async fn unreachable_and_silent_endpoints_are_outages() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = closed.local_addr().unwrap();
    drop(closed);
    let refused = SnsPublisher::new(
        &sdk_config(&format!("http://{address}")),
        TopicRouter::to(Aws::topic_arn("t")),
    );
    let events = stored(vec![event("a", 1)]);
    let outcomes = publish(&refused, &events).await;
    assert_eq!(
        classes(&outcomes),
        vec![Some(ErrorClass::Outage)],
        "{outcomes:?}"
    );

    let proxy = FaultProxy::start(&support::endpoint()).await;
    proxy.then(Reply::Hang);
    let config = sdk_config(&proxy.url())
        .into_builder()
        .timeout_config(
            aws_types::sdk_config::TimeoutConfig::builder()
                .operation_timeout(Duration::from_millis(800))
                .build(),
        )
        .build();
    let silent = SnsPublisher::new(&config, TopicRouter::to(Aws::topic_arn("t")));
    let outcomes = publish(&silent, &events).await;
    assert_eq!(
        classes(&outcomes),
        vec![Some(ErrorClass::Outage)],
        "{outcomes:?}"
    );
}

/// A wrong topic ARN is configuration, not the events' fault: the relay
/// pauses on it as an outage, fails nothing and burns no attempt, and
/// publishes every event once the topic exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_topic_arn_pauses_the_relay_until_the_topic_exists() {
    let aws = Aws::connect().await;
    let name = support::unique("missing");
    let publisher = Arc::new(PublishGate::new(OutageCounter::new(SnsPublisher::new(
        &aws.config,
        TopicRouter::to(Aws::topic_arn(&name)),
    ))));
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
    tokio::time::timeout(Duration::from_secs(60), publisher.inner.wait_for_outages(2))
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
    let queue = {
        let _closed = publisher.close().await;
        let topic = aws.create_topic(&name).await;
        let queue = aws.create_queue(&support::unique("missing-q")).await;
        aws.subscribe(&topic, &queue, true).await;
        queue
    };
    let got = aws.drain(&queue, events.len()).await;
    let ids: std::collections::HashSet<_> = got
        .iter()
        .map(|m| SqsEvent::decode(m).unwrap().event_id)
        .collect();
    assert_eq!(ids.len(), events.len(), "every event published once");
    shutdown.cancel();
    let report = relay.await.unwrap().unwrap();
    assert_eq!((report.failed, report.retried), (0, 0), "{report:?}");
    assert!(report.outages >= 2, "{report:?}");
}
