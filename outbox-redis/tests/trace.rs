//! OpenTelemetry across the hop: a span around the enqueue, the relay's
//! publish span, and the Redis consumer's handler span share one trace.

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::testing::RelayFleet;
use outbox_core::testing::trace_recorder::TraceRecorder;
use outbox_core::{CancellationToken, EventId, NewEvent, OutboxWriter};
use outbox_redis::{
    ConsumerConfig, Handler, HandlerError, RedisConsumer, RedisPublisher, StreamEvent, StreamRouter,
};
use outbox_sqlx::postgres::{EffectLog, EndToEndDb};
use sqlx::{Postgres, Transaction};
use tracing::Instrument;

const DEADLINE: Duration = Duration::from_secs(60);

/// Records the effect inside a span of its own, as application code does.
struct RecordEffect {
    log: EffectLog,
}

#[async_trait]
impl Handler<Transaction<'static, Postgres>, StreamEvent> for RecordEffect {
    async fn handle(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        event: &StreamEvent,
    ) -> Result<(), HandlerError> {
        self.log
            .record(tx, &event.partition_key, event.event_id)
            .instrument(tracing::info_span!("record_effect"))
            .await
            .map_err(|e| HandlerError::Retry(e.to_string()))
    }
}

/// Current-thread runtime: the relay and consumer tasks report to the
/// recorder this thread installed.
#[tokio::test]
async fn one_trace_runs_from_the_enqueue_through_redis_into_the_handler() {
    let recorder = TraceRecorder::install();
    let db = EndToEndDb::create("trace").await;
    let prefix = support::prefix();
    async {
        let paid = NewEvent::builder("invoice.paid", "invoice", "inv-1")
            .event_id(EventId::random())
            .payload(&serde_json::json!({ "amount_cents": 1200 }))
            .build()
            .unwrap();
        OutboxWriter::enqueue(&*db.store, &[paid]).await.unwrap();
    }
    .instrument(tracing::info_span!("pay_invoice"))
    .await;

    let publisher = Arc::new(RedisPublisher::new(
        support::connect(support::REDIS_URL).await,
        StreamRouter::with_prefix(&prefix),
    ));
    let relays = RelayFleet::spawn(db.store.clone(), publisher, "relay", 1);
    let mut config = ConsumerConfig::new("billing", "c1", vec![format!("{prefix}invoice.paid")]);
    config.block = Duration::from_millis(50);
    let consumer = RedisConsumer::new(
        support::connect(support::REDIS_URL).await,
        config,
        db.store.inbox(),
        RecordEffect {
            log: db.log.clone(),
        },
    )
    .expect("valid consumer settings");
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(consumer.run(stop.clone()));
    db.wait_for_effects(1, DEADLINE).await;
    relays.stop(DEADLINE).await;
    stop.cancel();
    assert_eq!(consumer.await.unwrap().unwrap().applied, 1);

    let trace = recorder.assert_one_trace("pay_invoice", "record_effect");
    println!("one trace from producer to handler: {trace}");
}
