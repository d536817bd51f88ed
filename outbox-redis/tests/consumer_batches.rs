//! The consumer applies new entries in batches (one inbox transaction, one
//! `XACK`): against a live Redis, every entry still ends as it would alone.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::memory::{MemoryInbox, MemoryInboxTx};
use outbox_core::testing::{DieAfterCommit, event};
use outbox_core::{CancellationToken, EventId, Publisher, RetryPolicy, StoredEvent};
use outbox_redis::{
    ConsumerConfig, Handler, HandlerError, RedisConsumer, RedisPublisher, StreamEvent, StreamRouter,
};
use redis::AsyncCommands;
use tokio::sync::Notify;

/// Records effects in commit order; rejects one event, fails another once.
struct Picky {
    committed: Arc<Mutex<Vec<EventId>>>,
    reject: EventId,
    blip: Mutex<Option<EventId>>,
}

#[async_trait]
impl Handler<MemoryInboxTx, StreamEvent> for Picky {
    async fn handle(
        &self,
        tx: &mut MemoryInboxTx,
        event: &StreamEvent,
    ) -> Result<(), HandlerError> {
        if event.event_id == self.reject {
            return Err(HandlerError::Reject("not ours".into()));
        }
        if self
            .blip
            .lock()
            .unwrap()
            .take_if(|id| *id == event.event_id)
            .is_some()
        {
            return Err(HandlerError::Retry("a blip".into()));
        }
        let committed = self.committed.clone();
        let id = event.event_id;
        tx.on_commit(move || committed.lock().unwrap().push(id));
        Ok(())
    }
}

/// `n` events on key "a", as a relay hands them to the publisher.
fn stored_events(n: usize) -> Vec<StoredEvent> {
    let now = chrono::Utc::now();
    (1..=n)
        .map(|n| StoredEvent {
            sequence: n as i64,
            event: event("a", n),
            created_at: now,
            available_at: now,
            attempts: 0,
        })
        .collect()
}

/// Publishes `n` events on key "a" to the `invoice.paid` stream of a fresh
/// prefix: (stream, the events in stream order).
async fn published(n: usize) -> (String, Vec<StoredEvent>) {
    let connection = support::connect(support::REDIS_URL).await;
    let publisher = RedisPublisher::new(connection, StreamRouter::with_prefix(support::prefix()));
    let stored = stored_events(n);
    let all: Vec<&StoredEvent> = stored.iter().collect();
    assert!(publisher.publish(&all).await.iter().all(Result::is_ok));
    (publisher.stream_for("invoice.paid"), stored)
}

/// A consumer that dies after committing a batch and before its `XACK`:
/// another reclaims every entry of it, and the inbox recognises each, so
/// no effect is applied twice and nothing stays pending.
#[tokio::test]
async fn a_consumer_dead_between_a_batch_commit_and_its_ack_leaves_no_effect_twice() {
    let (stream, stored) = published(6).await;
    let committed = Arc::new(Mutex::new(Vec::new()));
    let handler = || Picky {
        committed: committed.clone(),
        reject: EventId::random(),
        blip: Mutex::new(None),
    };
    let config = |name: &str| {
        let mut config = ConsumerConfig::new("g", name, vec![stream.clone()]);
        config.block = Duration::from_millis(50);
        config.reclaim_idle = Duration::from_millis(50);
        config
    };
    let inbox = MemoryInbox::new();
    let died = Arc::new(Notify::new());
    let doomed = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        config("doomed"),
        DieAfterCommit::new(inbox.clone(), 1, died.clone()),
        handler(),
    )
    .expect("valid consumer settings");
    let doomed = tokio::spawn(doomed.run(CancellationToken::new()));
    tokio::time::timeout(Duration::from_secs(30), died.notified())
        .await
        .expect("the first batch committed");
    doomed.abort();
    let _ = doomed.await;
    assert_eq!(committed.lock().unwrap().len(), 6, "one commit for the six");

    let stop = CancellationToken::new();
    let survivor = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        config("survivor"),
        inbox,
        handler(),
    )
    .expect("valid consumer settings");
    let survivor = tokio::spawn(survivor.run(stop.clone()));
    let mut connection = support::connect(support::REDIS_URL).await;
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let pending: redis::streams::StreamPendingReply =
                connection.xpending(&stream, "g").await.unwrap();
            if pending.count() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the dead consumer's entries reclaimed and acknowledged");
    stop.cancel();
    let report = survivor.await.unwrap().unwrap();
    assert_eq!((report.applied, report.duplicates), (0, 6), "{report:?}");
    let ids: Vec<EventId> = stored.iter().map(|s| s.event.event_id).collect();
    assert_eq!(
        *committed.lock().unwrap(),
        ids,
        "each effect once, in order"
    );
}

/// Nine events and an entry that does not decode, read in one batch: the
/// entry and a rejected event are dead-lettered in their places, an event
/// whose handler fails once rolls the batch back and is retried alone, and
/// the other eight are applied once each, in stream order; nothing is left
/// pending.
#[tokio::test]
async fn a_batch_with_a_bad_entry_a_rejection_and_a_blip_applies_the_rest_once_in_order() {
    let mut connection = support::connect(support::REDIS_URL).await;
    let publisher = RedisPublisher::new(
        connection.clone(),
        StreamRouter::with_prefix(support::prefix()),
    );
    let stream = publisher.stream_for("invoice.paid");
    let stored = stored_events(9);
    let first: Vec<&StoredEvent> = stored[..4].iter().collect();
    assert!(publisher.publish(&first).await.iter().all(Result::is_ok));
    let _: String = connection
        .xadd(&stream, "*", &[("garbage", "not an event")])
        .await
        .unwrap();
    let rest: Vec<&StoredEvent> = stored[4..].iter().collect();
    assert!(publisher.publish(&rest).await.iter().all(Result::is_ok));

    let ids: Vec<EventId> = stored.iter().map(|s| s.event.event_id).collect();
    let committed = Arc::new(Mutex::new(Vec::new()));
    let handler = Picky {
        committed: committed.clone(),
        reject: ids[2],
        blip: Mutex::new(Some(ids[5])),
    };
    let mut config = ConsumerConfig::new("g", "c1", vec![stream.clone()]);
    config.block = Duration::from_millis(50);
    config.handler_retry = RetryPolicy::immediate(3);
    assert!(config.apply_batch >= 10, "the test needs one batch for all");
    let consumer = RedisConsumer::new(connection.clone(), config, MemoryInbox::new(), handler)
        .expect("valid consumer settings");
    let stop = CancellationToken::new();
    let running = tokio::spawn(consumer.run(stop.clone()));
    tokio::time::timeout(Duration::from_secs(30), async {
        while committed.lock().unwrap().len() < 8 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("eight effects within 30 s");
    stop.cancel();
    let report = running.await.unwrap().unwrap();

    let expected: Vec<EventId> = ids.iter().copied().filter(|id| *id != ids[2]).collect();
    assert_eq!(*committed.lock().unwrap(), expected);
    assert_eq!((report.applied, report.dead_lettered), (8, 2), "{report:?}");
    let dead: redis::streams::StreamRangeReply = connection
        .xrange_all(format!("{stream}:dead"))
        .await
        .unwrap();
    assert_eq!(dead.ids.len(), 2);
    let pending: redis::streams::StreamPendingReply =
        connection.xpending(&stream, "g").await.unwrap();
    assert_eq!(pending.count(), 0, "every entry acknowledged");
}
