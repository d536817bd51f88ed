//! Messages the consumer cannot apply: received too often, foreign or
//! rejected, and the dead-letter queue's listing, showing and replay.

use super::*;
use outbox_core::dead_letter::DeadLetterQueue;

/// A message SQS has delivered more than `max_receives` times goes to the
/// dead-letter queue with the reason, the original body and attributes;
/// the handler never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_message_received_too_often_is_dead_lettered_with_the_error() {
    let setup = setup(false, true).await;
    let stored = setup.publish_in_order(&[event("often", 1)]).await;
    // Three deliveries that never finished (crashed consumers).
    for _ in 0..3 {
        let got = setup
            .aws
            .sqs
            .receive_message()
            .queue_url(&setup.queue_url)
            .visibility_timeout(0)
            .wait_time_seconds(5)
            .send()
            .await
            .unwrap();
        assert_eq!(got.messages.unwrap_or_default().len(), 1);
    }
    let mut config = setup.config("billing");
    config.max_receives = 3;
    let effects = Effects::default();
    let (token, handle) = spawn(
        SqsConsumer::new(
            &setup.aws.config,
            config,
            MemoryInbox::new(),
            effects.clone(),
        )
        .unwrap(),
    );
    let dead = setup.dead_letters(1).await;
    let report = stop(token, handle).await;
    assert_eq!((report.applied, report.dead_lettered), (0, 1), "{report:?}");
    assert!(effects.applied().is_empty());
    assert_eq!(dead[0]["error"], "received 4 times");
    assert_eq!(dead[0]["receive_count"], 4);
    assert_eq!(dead[0]["body"], stored[0].payload.as_str());
    assert_eq!(
        dead[0]["attributes"]["event_id"],
        stored[0].event_id.to_string()
    );
    assert_eq!(setup.aws.depth(&setup.queue_url).await, 0);
}

/// A message that is not an outbox event, and one the handler rejects, go
/// to the dead-letter queue with their errors; the events around them are
/// applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn foreign_and_rejected_messages_are_dead_lettered_and_the_rest_flow() {
    let setup = setup(false, true).await;
    setup
        .aws
        .sqs
        .send_message()
        .queue_url(&setup.queue_url)
        .message_body("not an outbox event")
        .send()
        .await
        .unwrap();
    let events = events_over_keys(3, 3);
    setup.publish_in_order(&events).await;
    let effects = Effects::default();
    effects.reject.lock().unwrap().insert(events[1].event_id);
    let (token, handle) = spawn(
        SqsConsumer::new(
            &setup.aws.config,
            setup.config("billing"),
            MemoryInbox::new(),
            effects.clone(),
        )
        .unwrap(),
    );
    let dead = setup.dead_letters(2).await;
    effects.wait_for(2).await;
    let report = stop(token, handle).await;
    assert_eq!((report.applied, report.dead_lettered), (2, 2), "{report:?}");
    let errors: HashSet<String> = dead
        .iter()
        .map(|d| d["error"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        errors.iter().any(|e| e.contains("rejected by the test")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("not an outbox event")),
        "{errors:?}"
    );
}

/// `outbox dead-letters` on SQS, raw and enveloped, standard and FIFO: a
/// rejected event's dead letter is listed with its error and identity,
/// shown with its payload, replayed once to the queue it came from (two
/// operators at the same moment: one replays, the other finds nothing to
/// replay; the record travels as attributes), and the consumer applies it
/// once the cause is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_dead_letter_is_listed_shown_and_replayed_once() {
    use outbox_core::dead_letter::ReplayRefused;
    use outbox_sns::{DeadLetterError, SqsDeadLetters};

    for (fifo, raw) in [(false, true), (true, false)] {
        let setup = setup(fifo, raw).await;
        let events = events_over_keys(2, 1);
        setup.publish_in_order(&events).await;
        let effects = Effects::default();
        effects.reject.lock().unwrap().insert(events[0].event_id);
        let (token, handle) = spawn(
            SqsConsumer::new(
                &setup.aws.config,
                setup.config("billing"),
                MemoryInbox::new(),
                effects.clone(),
            )
            .unwrap(),
        );
        effects.wait_for(1).await;
        let dead_letters = SqsDeadLetters::new(setup.aws.sqs.clone(), &setup.dead_letter_url);
        let listed = within("a dead letter", async {
            loop {
                let listed = dead_letters.list(None, 10).await.unwrap();
                if !listed.is_empty() {
                    return listed;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        let [dead] = listed.as_slice() else {
            panic!("one dead letter: {listed:?}");
        };
        let case = format!("fifo {fifo}, raw {raw}");
        assert_eq!(
            dead.event_id,
            Some(events[0].event_id.to_string()),
            "{case}"
        );
        assert!(
            dead.error.contains("rejected by the test"),
            "{case}: {dead:?}"
        );
        assert_eq!(dead.source, setup.queue_url, "{case}");
        assert_eq!(dead.deliveries, Some(1), "{case}");
        let shown = dead_letters.get(&dead.id).await.unwrap().expect("shown");
        assert_eq!(
            shown.payload,
            events[0].payload.as_bytes(),
            "{case}: the payload, not the envelope"
        );
        assert!(dead_letters.get("no-such-id").await.unwrap().is_none());

        effects.reject.lock().unwrap().clear();
        assert!(matches!(
            dead_letters.replay(&dead.id, "", "fixed").await,
            Err(DeadLetterError::Refused(ReplayRefused::Unattributed))
        ));
        let (first, second) = tokio::join!(
            dead_letters.replay(&dead.id, "ana", "downstream fixed"),
            dead_letters.replay(&dead.id, "bo", "downstream fixed"),
        );
        let (replay, refused) = match (first, second) {
            (Ok(replay), Err(refused)) | (Err(refused), Ok(replay)) => (replay, refused),
            other => panic!("{case}: one replay, one refusal: {other:?}"),
        };
        assert!(
            matches!(
                refused,
                DeadLetterError::Refused(ReplayRefused::NotFound(_))
            ),
            "{case}: {refused}"
        );
        assert!(!replay.new_id.is_empty());
        assert!(matches!(
            dead_letters.replay(&dead.id, "ana", "again").await,
            Err(DeadLetterError::Refused(ReplayRefused::NotFound(_)))
        ));
        effects.wait_for(2).await;
        let report = stop(token, handle).await;
        assert_eq!(
            (report.applied, report.dead_lettered),
            (2, 1),
            "{case}: {report:?}"
        );
        let applied: Vec<EventId> = effects.applied().iter().map(|(_, id)| *id).collect();
        assert_eq!(
            applied,
            vec![events[1].event_id, events[0].event_id],
            "{case}"
        );
        assert!(
            dead_letters.list(None, 10).await.unwrap().is_empty(),
            "{case}"
        );
        assert!(
            matches!(
                dead_letters.list(Some(&dead.id), 10).await,
                Err(outbox_sns::DeadLetterError::Unordered)
            ),
            "SQS has no order to page by: {case}"
        );
    }
}
