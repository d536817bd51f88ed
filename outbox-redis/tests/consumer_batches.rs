//! The consumer applies new entries in batches (one inbox transaction, one
//! `XACK`): against a live Redis, every entry still ends as it would alone.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::memory::{MemoryInbox, MemoryInboxTx};
use outbox_core::testing::event;
use outbox_core::{CancellationToken, EventId, Publisher, RetryPolicy, StoredEvent};
use outbox_redis::{
    ConsumerConfig, Handler, HandlerError, RedisConsumer, RedisPublisher, StreamEvent, StreamRouter,
};
use redis::AsyncCommands;

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

/// Nine events and an entry that does not decode, read in one batch: the
/// entry and a rejected event are dead-lettered in their places, an event
/// whose handler fails once rolls the batch back and is retried alone, and
/// the other eight are applied once each, in stream order; nothing is left
/// pending.
#[tokio::test]
async fn a_batch_with_a_bad_entry_a_rejection_and_a_blip_applies_the_rest_once_in_order() {
    let prefix = support::prefix();
    let mut connection = support::connect(support::REDIS_URL).await;
    let publisher = RedisPublisher::new(connection.clone(), StreamRouter::with_prefix(&prefix));
    let stream = publisher.stream_for("invoice.paid");
    let now = chrono::Utc::now();
    let stored: Vec<StoredEvent> = (1..=9)
        .map(|n| StoredEvent {
            sequence: n as i64,
            event: event("a", n),
            created_at: now,
            available_at: now,
            attempts: 0,
        })
        .collect();
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
