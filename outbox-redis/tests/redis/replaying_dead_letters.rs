//! `outbox dead-letters` on Redis: a dead letter is listed with its error,
//! shown with its fields and payload, replayed once (two operators at the
//! same moment: one replay, the other refused with the first's record),
//! and its consumer applies it once the cause is fixed.

use std::time::Duration;

use outbox_core::dead_letter::{DeadLetterQueue, ReplayRefused};
use outbox_core::memory::MemoryInbox;
use outbox_core::testing::{Downstream, event};
use outbox_core::{CancellationToken, Publisher, RetryPolicy, StoredEvent};
use outbox_redis::{
    ConsumerConfig, DeadLetterError, RedisConsumer, RedisDeadLetters, RedisPublisher, StreamRouter,
};

use super::support;

async fn eventually(what: &str, done: impl AsyncFn() -> bool) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while !done().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} within 30 s"));
}

#[tokio::test]
async fn a_dead_letter_is_listed_shown_and_replayed_once() {
    let prefix = support::prefix();
    let connection = support::connect(support::REDIS_URL).await;
    let publisher = RedisPublisher::new(connection.clone(), StreamRouter::with_prefix(&prefix));
    let now = chrono::Utc::now();
    let stored = StoredEvent {
        sequence: 1,
        event: event("a", 1),
        created_at: now,
        available_at: now,
        attempts: 0,
    };
    assert!(publisher.publish(&[&stored]).await[0].is_ok());
    let stream = publisher.stream_for("invoice.paid");

    let downstream = Downstream::retrying("downstream says no");
    let mut config = ConsumerConfig::new("g", "c1", vec![stream.clone()]);
    config.block = Duration::from_millis(50);
    config.handler_retry = RetryPolicy::immediate(2);
    let stop = CancellationToken::new();
    let consumer = RedisConsumer::new(
        connection.clone(),
        config,
        MemoryInbox::new(),
        downstream.clone(),
    )
    .expect("valid consumer settings");
    let consumer = tokio::spawn(consumer.run(stop.clone()));

    let dead_letters = RedisDeadLetters::new(connection.clone(), &stream, ":dead");
    eventually("a dead letter", async || {
        !dead_letters.list(None, 10).await.unwrap().is_empty()
    })
    .await;
    let listed = dead_letters.list(None, 10).await.unwrap();
    let [dead] = listed.as_slice() else {
        panic!("one dead letter: {listed:?}");
    };
    assert_eq!(dead.event_id, Some(stored.event.event_id.to_string()));
    assert_eq!(dead.error, "downstream says no");
    assert_eq!(dead.source, stream);
    assert_eq!(dead.replayed, None);
    assert!(
        dead.headers
            .iter()
            .all(|(name, _)| !name.starts_with("dlq."))
    );
    let shown = dead_letters.get(&dead.id).await.unwrap().expect("shown");
    assert_eq!(shown.payload, stored.event.payload.as_bytes());
    assert!(dead_letters.get("1-1").await.unwrap().is_none());

    downstream.fix();
    let unattributed = dead_letters.replay(&dead.id, "", "fixed").await;
    assert!(matches!(
        unattributed,
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
        earlier, replay,
        "the refusal names the replay that happened"
    );
    let again = dead_letters.replay(&dead.id, "ana", "again").await;
    assert!(matches!(
        again,
        Err(DeadLetterError::Refused(
            ReplayRefused::AlreadyReplayed { .. }
        ))
    ));
    assert!(matches!(
        dead_letters.replay("1-1", "ana", "none").await,
        Err(DeadLetterError::Refused(ReplayRefused::NotFound(_)))
    ));

    eventually("the replay applied", async || downstream.applied() == 1).await;
    stop.cancel();
    let report = consumer.await.unwrap().unwrap();
    assert_eq!((report.applied, report.dead_lettered), (1, 1), "{report:?}");
    assert_eq!(downstream.applied(), 1);
    let listed = dead_letters.list(None, 10).await.unwrap();
    assert_eq!(listed[0].replayed.as_ref(), Some(&replay), "the record");
    assert!(["ana", "bo"].contains(&replay.operator.as_str()));
    assert!(
        dead_letters
            .list(Some(&dead.id), 10)
            .await
            .unwrap()
            .is_empty()
    );
}
