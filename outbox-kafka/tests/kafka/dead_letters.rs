//! Events the relay or the consumer cannot deliver: the dead-letter topic,
//! its listing, showing and replay, and messages whose headers are not
//! UTF-8.

use super::*;
use outbox_core::dead_letter::DeadLetterQueue;

/// A handler that rejects an event: it goes to `{topic}.dlq` with its
/// original headers and the error, and the consumer moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_rejected_event_goes_to_the_dead_letter_topic() {
    use outbox_core::memory::{MemoryInbox, MemoryInboxTx};
    use outbox_kafka::{Handler, HandlerError, KafkaConsumer, KafkaConsumerConfig, KafkaEvent};

    struct RejectFirst(EventId);
    #[async_trait]
    impl Handler<MemoryInboxTx, KafkaEvent> for RejectFirst {
        async fn handle(
            &self,
            _tx: &mut MemoryInboxTx,
            event: &KafkaEvent,
        ) -> Result<(), HandlerError> {
            if event.event_id == self.0 {
                return Err(HandlerError::Reject("amount is negative".into()));
            }
            Ok(())
        }
    }

    let harness = Harness::new().await;
    let topic = harness.publisher.topic_for("invoice.paid");
    create_topic(&format!("{topic}.dlq")).await;
    let events = stored(vec![event("a", 0), event("a", 1)]);
    let refs: Vec<&StoredEvent> = events.iter().collect();
    assert!(
        harness
            .publisher
            .publish(&refs)
            .await
            .iter()
            .all(Result::is_ok)
    );
    let mut config =
        KafkaConsumerConfig::new(bootstrap(), format!("dlq-{topic}"), vec![topic.clone()]);
    config
        .librdkafka
        .push(("session.timeout.ms".into(), "6000".into()));
    let consumer =
        KafkaConsumer::new(config, MemoryInbox::new(), RejectFirst(events[0].event_id)).unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(consumer.run(stop.clone()));
    let dead = read(&reader(&format!("{topic}.dlq")), 1).await;
    assert_eq!(dead[0].event_id, events[0].event_id);
    assert!(
        dead[0]
            .headers
            .iter()
            .any(|(k, v)| k == "dlq.error" && v == "amount is negative"),
        "{:?}",
        dead[0].headers
    );
    assert!(
        dead[0].headers.iter().any(|(k, _)| k == "traceparent"),
        "original headers kept"
    );
    // The consumer checks for shutdown between messages, so the dead letter
    // already read above is in its report.
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(report.dead_lettered, 1, "{report:?}");
}

/// `outbox dead-letters` on Kafka: a rejected event's dead letter is listed
/// with its error, shown with its headers and payload, replayed once to its
/// topic (two operators at the same moment: one replay, the other refused
/// with the first's record), and the consumer applies it once the cause is
/// fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_dead_letter_is_listed_shown_and_replayed_once() {
    use outbox_core::dead_letter::ReplayRefused;
    use outbox_core::memory::MemoryInbox;
    use outbox_core::testing::Downstream;
    use outbox_kafka::{DeadLetterError, KafkaConsumer, KafkaConsumerConfig, KafkaDeadLetters};

    let harness = Harness::new().await;
    let topic = harness.publisher.topic_for("invoice.paid");
    create_topic(&format!("{topic}.dlq")).await;
    let events = stored(vec![event("a", 0)]);
    assert!(harness.publisher.publish(&[&events[0]]).await[0].is_ok());
    let downstream = Downstream::rejecting("amount is negative");
    let mut config =
        KafkaConsumerConfig::new(bootstrap(), format!("replay-{topic}"), vec![topic.clone()]);
    config
        .librdkafka
        .push(("session.timeout.ms".into(), "6000".into()));
    let consumer = KafkaConsumer::new(config, MemoryInbox::new(), downstream.clone()).unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(consumer.run(stop.clone()));

    let dead_letters = KafkaDeadLetters::new(&bootstrap(), &topic, ".dlq");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let listed = loop {
        let listed = dead_letters.list(None, 10).await.unwrap();
        if !listed.is_empty() {
            break listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no dead letter in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let [dead] = listed.as_slice() else {
        panic!("one dead letter: {listed:?}");
    };
    assert_eq!(dead.event_id, Some(events[0].event_id.to_string()));
    assert_eq!(dead.error, "amount is negative");
    assert_eq!(dead.source, topic);
    assert_eq!(dead.partition_key.as_deref(), Some("a"));
    assert_eq!(dead.replayed, None);
    assert!(
        dead.headers
            .iter()
            .all(|(name, _)| !name.starts_with("dlq."))
    );
    let shown = dead_letters.get(&dead.id).await.unwrap().expect("shown");
    assert_eq!(shown.payload, events[0].event.payload.as_bytes());
    assert!(dead_letters.get("0/999999").await.unwrap().is_none());

    downstream.fix();
    assert!(matches!(
        dead_letters.replay(&dead.id, "ana", " ").await,
        Err(DeadLetterError::Refused(ReplayRefused::Unattributed))
    ));
    let (first, second) = tokio::join!(
        dead_letters.replay(&dead.id, "ana", "downstream fixed"),
        dead_letters.replay(&dead.id, "bo", "downstream fixed"),
    );
    let (replay, refused) = match (first, second) {
        (Ok(replay), Err(refused)) | (Err(refused), Ok(replay)) => (replay, refused),
        other => panic!("one replay, one refusal: {other:?}"),
    };
    let DeadLetterError::Refused(ReplayRefused::AlreadyReplayed {
        replay: earlier, ..
    }) = refused
    else {
        panic!("refused as already replayed: {refused}");
    };
    assert_eq!(
        earlier.operator, replay.operator,
        "the refusal names the replay"
    );
    assert!(matches!(
        dead_letters.replay(&dead.id, "ana", "again").await,
        Err(DeadLetterError::Refused(
            ReplayRefused::AlreadyReplayed { .. }
        ))
    ));
    assert!(matches!(
        dead_letters.replay("0/999999", "ana", "none").await,
        Err(DeadLetterError::Refused(ReplayRefused::NotFound(_)))
    ));

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while downstream.applied() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replay not applied in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((report.applied, report.dead_lettered), (1, 1), "{report:?}");
    assert_eq!(downstream.applied(), 1);
    let listed = dead_letters.list(None, 10).await.unwrap();
    assert_eq!(listed[0].replayed.as_ref(), Some(&replay), "the record");
}

/// A message whose header is not UTF-8 (written by another producer) cannot
/// be decoded: it goes to the dead-letter topic with the decode error, the
/// handler never sees it, and the consumer moves on to the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_header_that_is_not_utf8_is_dead_lettered_and_the_rest_flows() {
    use outbox_core::memory::{MemoryInbox, MemoryInboxTx};
    use outbox_kafka::{Handler, HandlerError, KafkaConsumer, KafkaConsumerConfig, KafkaEvent};
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    struct Applies(Arc<std::sync::Mutex<Vec<EventId>>>);
    #[async_trait]
    impl Handler<MemoryInboxTx, KafkaEvent> for Applies {
        async fn handle(
            &self,
            _: &mut MemoryInboxTx,
            event: &KafkaEvent,
        ) -> Result<(), HandlerError> {
            self.0.lock().unwrap().push(event.event_id);
            Ok(())
        }
    }

    let harness = Harness::new().await;
    let topic = harness.publisher.topic_for("invoice.paid");
    create_topic(&format!("{topic}.dlq")).await;
    let foreign: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let bad_id = EventId::random().to_string();
    let not_utf8: &[u8] = &[0xff, 0xfe, 0x00];
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "event_id",
            value: Some(bad_id.as_bytes()),
        })
        .insert(Header {
            key: "event_type",
            value: Some("invoice.paid".as_bytes()),
        })
        .insert(Header {
            key: "note",
            value: Some(not_utf8),
        });
    foreign
        .send(
            FutureRecord::to(&topic)
                .key("a")
                .payload("{}")
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let good = stored(vec![event("a", 1)]);
    assert!(harness.publisher.publish(&[&good[0]]).await[0].is_ok());

    let config =
        KafkaConsumerConfig::new(bootstrap(), format!("utf8-{topic}"), vec![topic.clone()]);
    let applied: Arc<std::sync::Mutex<Vec<EventId>>> = Arc::default();
    let consumer =
        KafkaConsumer::new(config, MemoryInbox::new(), Applies(applied.clone())).unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(consumer.run(stop.clone()));
    let dead_reader = reader(&format!("{topic}.dlq"));
    let message = tokio::time::timeout(Duration::from_secs(30), dead_reader.recv())
        .await
        .expect("a dead letter")
        .unwrap();
    let error = message
        .headers()
        .and_then(|h| {
            h.iter()
                .find(|h| h.key == "dlq.error")
                .and_then(|h| h.value)
        })
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .expect("dlq.error header");
    assert!(
        error.contains("note"),
        "the error names the header: {error}"
    );
    tokio::time::timeout(Duration::from_secs(30), async {
        while !applied.lock().unwrap().contains(&good[0].event_id) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the message after the bad one is applied");
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((report.dead_lettered, report.applied), (1, 1), "{report:?}");
    assert_eq!(applied.lock().unwrap().as_slice(), &[good[0].event_id]);
}
