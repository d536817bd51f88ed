use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::memory::{MemoryInbox, MemoryInboxTx};
use outbox_core::testing::event;
use outbox_core::{CancellationToken, Publisher, RetryPolicy, StoredEvent};
use outbox_redis::{
    ConsumerConfig, Handler, HandlerError, RedisConsumer, RedisPublisher, StreamEvent, StreamRouter,
};
use redis::AsyncCommands;
use redis::streams::StreamRangeReply;
use tokio::sync::Notify;

use super::support;

/// Fails every time, or hangs (a consumer that dies mid-handler).
struct Failing {
    hang: Option<Arc<Notify>>,
}

#[async_trait]
impl Handler<MemoryInboxTx, StreamEvent> for Failing {
    async fn handle(
        &self,
        _tx: &mut MemoryInboxTx,
        _event: &StreamEvent,
    ) -> Result<(), HandlerError> {
        if let Some(started) = &self.hang {
            started.notify_one();
            std::future::pending::<()>().await;
        }
        Err(HandlerError::Retry("downstream says no".into()))
    }
}

async fn published(prefix: &str) -> (String, StoredEvent) {
    let connection = support::connect(support::REDIS_URL).await;
    let publisher = RedisPublisher::new(connection, StreamRouter::with_prefix(prefix));
    let now = chrono::Utc::now();
    let stored = StoredEvent {
        sequence: 1,
        event: event("a", 1),
        created_at: now,
        available_at: now,
        attempts: 0,
    };
    assert!(publisher.publish(&[&stored]).await[0].is_ok());
    (publisher.stream_for("invoice.paid"), stored)
}

fn config(stream: &str, consumer: &str) -> ConsumerConfig {
    let mut config = ConsumerConfig::new("g", consumer, vec![stream.to_owned()]);
    config.block = Duration::from_millis(50);
    config.reclaim_idle = Duration::from_millis(50);
    config.handler_retry = RetryPolicy::immediate(3);
    config
}

async fn wait_for_dead_letter(stream: &str) -> std::collections::HashMap<String, String> {
    let mut connection = support::connect(support::REDIS_URL).await;
    let dead = format!("{stream}:dead");
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let reply: StreamRangeReply = connection.xrange_all(&dead).await.unwrap();
            if let Some(entry) = reply.ids.first() {
                return entry
                    .map
                    .iter()
                    .filter_map(|(k, v)| match v {
                        redis::Value::BulkString(b) => {
                            Some((k.clone(), String::from_utf8_lossy(b).into_owned()))
                        }
                        _ => None,
                    })
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a dead letter")
}

/// A handler that keeps failing: retried in place, then dead-lettered
/// with the original fields and the error, and acknowledged.
#[tokio::test]
async fn a_failing_handler_ends_in_the_dead_letter_stream() {
    let prefix = support::prefix();
    let (stream, stored) = published(&prefix).await;
    let stop = CancellationToken::new();
    let consumer = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        config(&stream, "c1"),
        MemoryInbox::new(),
        Failing { hang: None },
    )
    .expect("valid consumer settings");
    let consumer = tokio::spawn(consumer.run(stop.clone()));
    let dead = wait_for_dead_letter(&stream).await;
    stop.cancel();
    let report = consumer.await.unwrap().unwrap();
    assert_eq!((report.dead_lettered, report.applied), (1, 0));
    assert_eq!(dead["event_id"], stored.event_id.to_string());
    assert_eq!(dead["dlq.error"], "downstream says no");
    let pending: redis::streams::StreamPendingReply = support::connect(support::REDIS_URL)
        .await
        .xpending(&stream, "g")
        .await
        .unwrap();
    assert_eq!(pending.count(), 0, "dead-lettered entries are acknowledged");
}

/// An entry delivered more than `max_deliveries` times (its consumers
/// keep dying) goes to the dead-letter stream with its delivery count.
#[tokio::test]
async fn an_entry_delivered_too_often_is_dead_lettered() {
    let prefix = support::prefix();
    let (stream, stored) = published(&prefix).await;
    let started = Arc::new(Notify::new());
    let mut cfg = config(&stream, "doomed");
    cfg.max_deliveries = 1;
    let doomed = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        cfg.clone(),
        MemoryInbox::new(),
        Failing {
            hang: Some(started.clone()),
        },
    )
    .expect("valid consumer settings");
    let doomed = tokio::spawn(doomed.run(CancellationToken::new()));
    tokio::time::timeout(Duration::from_secs(30), started.notified())
        .await
        .unwrap();
    doomed.abort();
    let _ = doomed.await;

    cfg.consumer = "survivor".into();
    let stop = CancellationToken::new();
    let survivor = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        cfg,
        MemoryInbox::new(),
        Failing { hang: None },
    )
    .expect("valid consumer settings");
    let survivor = tokio::spawn(survivor.run(stop.clone()));
    let dead = wait_for_dead_letter(&stream).await;
    stop.cancel();
    let report = survivor.await.unwrap().unwrap();
    assert_eq!(
        (report.broker.reclaimed, report.dead_lettered),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(dead["event_id"], stored.event_id.to_string());
    assert_eq!(dead["dlq.deliveries"], "2");
}
