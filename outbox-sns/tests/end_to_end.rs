//! PostgreSQL outbox → relays → SNS topic → SQS queue → consumer runner →
//! PostgreSQL inbox, against the emulator (`scripts/sns.sh`), with relays
//! killed after publishing and the emulator itself stopped mid-run.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::store::{EventState, OutboxAdmin};
use outbox_core::testing::{
    DieAfterPublishing, OutageCounter, PublishGate, assert_exactly_once_in_key_order,
    events_over_keys, relay_suite,
};
use outbox_core::{EventId, OutboxWriter, Publisher};
use outbox_sns::{ConsumerReport, SnsPublisher, SqsEvent, TopicRouter};
use support::end_to_end::*;
use support::{Aws, OwnEmulator, unique};
use tokio::sync::Notify;

/// Four relays → FIFO topic → FIFO queue → consumer: 400 events over 20
/// keys, each applied once, each key in enqueue order at the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_through_a_fifo_topic_apply_once_in_key_order() {
    let setup = setup(true, true).await;
    let events = events_over_keys(400, 20);
    OutboxWriter::enqueue(&*setup.store, &events).await.unwrap();
    let relays = setup.relays(Arc::new(setup.publisher()), 4);
    let consumed = run_consumer_until(&setup, 400).await;
    let report = relays.stop(DEADLINE).await;
    assert_eq!((report.published, report.failed), (400, 0), "{report:?}");
    assert_eq!(consumed.applied, 400, "{consumed:?}");
    assert_exactly_once_in_key_order(&setup.effects().await, &events);
}

/// The same through a standard topic and an enveloped subscription: order
/// is not promised there, so the test checks exactly-once only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_through_a_standard_topic_apply_each_event_once() {
    let setup = setup(false, false).await;
    let events = events_over_keys(400, 20);
    OutboxWriter::enqueue(&*setup.store, &events).await.unwrap();
    let relays = setup.relays(Arc::new(setup.publisher()), 4);
    let consumed = run_consumer_until(&setup, 400).await;
    let report = relays.stop(DEADLINE).await;
    assert_eq!((report.published, report.failed), (400, 0), "{report:?}");
    let effects = setup.effects().await;
    let applied: HashSet<EventId> = effects.iter().map(|(_, id)| *id).collect();
    assert_eq!(applied.len(), effects.len(), "an event was applied twice");
    let sent: HashSet<EventId> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(applied, sent, "{consumed:?}");
}

/// A relay killed after publishing one event and before acknowledging it;
/// its lease expires and another relay publishes the event (and the rest
/// of its batch) again. The consumer starts at once, or, when
/// `consume_after_republish`, only once everything is published. Returns
/// the consumer's report.
async fn kill_a_relay_after_publish(
    setup: &Setup,
    consume_after_republish: bool,
) -> ConsumerReport {
    let events = events_over_keys(20, 4);
    OutboxWriter::enqueue(&*setup.store, &events).await.unwrap();
    let died = Arc::new(Notify::new());
    let doomed = Arc::new(DieAfterPublishing::new(
        setup.publisher(),
        events[5].event_id,
        died.clone(),
    ));
    let doomed_relays = setup.relays(doomed, 1);
    within("the relay's death", died.notified()).await;
    doomed_relays.kill().await;
    assert!(matches!(
        setup.store.event_state(events[5].event_id).await.unwrap(),
        Some(EventState::InFlight { .. })
    ));
    setup.advance_store_time(relay_suite::config("x").lease_duration + Duration::from_secs(1));
    let relays = setup.relays(Arc::new(setup.publisher()), 1);
    if consume_after_republish {
        setup.wait_for_published(&events, DEADLINE).await;
    }
    let report = run_consumer_until(setup, 20).await;
    let relayed = relays.stop(DEADLINE).await;
    assert!(
        relayed.published >= 15,
        "the victim is published again: {relayed:?}"
    );
    assert_exactly_once_in_key_order(&setup.effects().await, &events);
    report
}

/// On a FIFO topic a republished event carries the same deduplication id
/// (its event id). Republished while the first copy is still queued, it is
/// dropped before the queue: the consumer receives each event once, 0
/// duplicates. Absorbed by FIFO deduplication, not by the inbox. (AWS
/// drops it for five minutes whether or not the first copy was consumed;
/// the emulator only while it is still queued — see the next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_after_publish_is_absorbed_by_fifo_deduplication() {
    let setup = setup_on_manual_clock(true, true).await;
    let report = kill_a_relay_after_publish(&setup, true).await;
    assert_eq!(
        report.duplicates, 0,
        "deduplication dropped the republish: {report:?}"
    );
    assert_eq!(report.broker.received, 20, "{report:?}");
}

/// The same with the consumer running while the event is republished: the
/// first copy was already consumed and deleted, the emulator delivers the
/// second, and the inbox absorbs it (each event still applied once, in key
/// order). On AWS, deduplication would have dropped it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_republish_after_the_first_copy_was_consumed_is_absorbed_by_the_inbox() {
    let setup = setup_on_manual_clock(true, true).await;
    let report = kill_a_relay_after_publish(&setup, false).await;
    assert_eq!(report.applied, 20, "{report:?}");
}

/// On a standard topic the republished event reaches the queue twice and
/// the inbox absorbs it. Absorbed by the inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_after_publish_is_absorbed_by_the_inbox_on_a_standard_topic() {
    let setup = setup_on_manual_clock(false, true).await;
    let report = kill_a_relay_after_publish(&setup, true).await;
    assert!(
        report.duplicates >= 1,
        "the inbox absorbed the republish: {report:?}"
    );
}

/// The emulator killed mid-run: the relay meets outages, burns no attempt
/// and fails nothing; once the emulator is back (the topic and queue made
/// again: it keeps nothing) every event not yet published is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_stopped_mid_run_is_an_outage_and_nothing_is_lost() {
    let setup = setup(false, true).await;
    let mut emulator = OwnEmulator::start().await;
    let aws = Aws::connect_to(&emulator.endpoint()).await;
    let topic_name = unique("own-topic");
    let queue_name = unique("own-queue");
    let make_topic_and_queue = || async {
        let topic = aws.create_topic(&topic_name).await;
        let queue = aws.create_queue(&queue_name).await;
        aws.subscribe(&topic, &queue, true).await;
        (topic, queue)
    };
    let (topic, queue) = make_topic_and_queue().await;
    let events = events_over_keys(200, 10);
    OutboxWriter::enqueue(&*setup.store, &events).await.unwrap();
    let publisher = Arc::new(PublishGate::new(OutageCounter::new(SnsPublisher::new(
        &aws.config,
        TopicRouter::to(&topic),
    ))));
    let relays = setup.relays(publisher.clone(), 1);

    within("the first events published", async {
        while aws.depth(&queue).await < 40 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut seen: Vec<EventId> = {
        let _held = publisher.close().await;
        let waiting = aws.depth(&queue).await;
        let before = aws.drain(&queue, waiting).await;
        emulator.stop().await;
        before
            .iter()
            .map(|m| SqsEvent::decode(m).unwrap().event_id)
            .collect()
    };
    assert!(seen.len() < events.len(), "the kill came mid-run");
    let outages_before = publisher.inner.outages();
    within(
        "two outages while the emulator is down",
        publisher.inner.wait_for_outages(outages_before + 2),
    )
    .await;
    // Where status and health read it: the relay, paused, names the topic
    // and the SDK's error.
    let paused = OutboxAdmin::relays(&*setup.store).await.unwrap();
    let outage = paused
        .iter()
        .find_map(|r| r.outage.clone())
        .unwrap_or_else(|| panic!("no outage recorded: {paused:?}"));
    assert_eq!(outage.destination, format!("sns {topic}"));
    assert_eq!(outage.destination, publisher.destination());
    assert!(!outage.reason.is_empty());
    {
        let _held = publisher.close().await;
        emulator.restart().await;
        let (again, _) = make_topic_and_queue().await;
        assert_eq!(again, topic, "the same name gives the same ARN");
    }
    let rest = aws.drain(&queue, events.len() - seen.len()).await;
    seen.extend(rest.iter().map(|m| SqsEvent::decode(m).unwrap().event_id));
    within("the outage cleared once publishing works", async {
        while OutboxAdmin::relays(&*setup.store)
            .await
            .unwrap()
            .iter()
            .any(|r| r.outage.is_some())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let report = relays.stop(DEADLINE).await;
    let unique_seen: HashSet<EventId> = seen.iter().copied().collect();
    assert_eq!(unique_seen.len(), seen.len(), "nothing published twice");
    let sent: HashSet<EventId> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(unique_seen, sent, "every event delivered");
    assert_eq!((report.failed, report.retried), (0, 0), "{report:?}");
    assert!(report.outages >= 2, "{report:?}");
    for e in &events {
        let history = OutboxAdmin::history(&*setup.store, e.event_id)
            .await
            .unwrap();
        assert!(history.is_empty(), "no attempt burned: {history:?}");
    }
}
