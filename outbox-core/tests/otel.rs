//! One trace from the producer's span to the consumer's handler (feature
//! `otel`): the event captures the producer's context at build, the relay's
//! publish span links to it, and the consumer's span is its child.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::consume::{Applied, Applier, Handler, HandlerError, default_store_outage};
use outbox_core::memory::{MemoryInbox, MemoryInboxTx, MemoryStore, RecordingPublisher};
use outbox_core::policy::FixedRandom;
use outbox_core::store::OutboxWriter;
use outbox_core::testing::relay_suite;
use outbox_core::testing::trace_recorder::{TraceRecorder, ids, links};
use outbox_core::trace::{CONSUME_SPAN, PUBLISH_SPAN};
use outbox_core::{CancellationToken, EventId, Headers, NewEvent, Relay, RetryPolicy, StoredEvent};

const DEADLINE: Duration = Duration::from_secs(30);

fn invoice_paid(invoice: &str) -> NewEvent {
    NewEvent::builder("invoice.paid", "invoice", invoice)
        .event_id(EventId::random())
        .payload(&serde_json::json!({ "invoice": invoice }))
        .build()
        .unwrap()
}

/// A handler that opens a span of its own, as application code does.
struct RecordRevenue;

#[async_trait::async_trait]
impl Handler<MemoryInboxTx, StoredEvent> for RecordRevenue {
    async fn handle(&self, _tx: &mut MemoryInboxTx, _: &StoredEvent) -> Result<(), HandlerError> {
        let _span = tracing::info_span!("record_revenue").entered();
        Ok(())
    }
}

async fn relay_all(events: &[NewEvent]) -> Vec<StoredEvent> {
    let store = Arc::new(MemoryStore::new());
    store.enqueue(events).await.unwrap();
    let publisher = Arc::new(RecordingPublisher::new());
    let relay = Relay::new(store, publisher.clone(), relay_suite::config("traced")).unwrap();
    let shutdown = CancellationToken::new();
    let task = relay.spawn(shutdown.clone());
    tokio::time::timeout(DEADLINE, publisher.wait_for_deliveries(events.len()))
        .await
        .expect("the relay publishes");
    shutdown.cancel();
    task.await.unwrap().unwrap();
    publisher.delivered()
}

async fn consume(event: &StoredEvent) -> Applied {
    let inbox = MemoryInbox::new();
    let shutdown = CancellationToken::new();
    let mut applier = Applier {
        inbox: &inbox,
        consumer: "billing",
        handler: &RecordRevenue,
        handler_retry: &RetryPolicy::immediate(1),
        store_outage: &default_store_outage(),
        random: &FixedRandom(0.5),
        shutdown: &shutdown,
        store_retries: 0,
    };
    applier
        .apply(event.event_id, &event.headers, event)
        .await
        .unwrap()
}

#[tokio::test]
async fn one_trace_runs_from_the_producer_through_the_relay_into_the_handler() {
    let recorder = TraceRecorder::install();
    let event = tracing::info_span!("checkout").in_scope(|| invoice_paid("inv-1"));
    let producer = recorder.one("checkout");
    let (trace, producer_span) = ids(&producer);
    assert_eq!(
        event.headers.traceparent.as_deref(),
        Some(format!("00-{trace}-{producer_span}-01").as_str()),
        "build() captured the producer's span"
    );

    let delivered = relay_all(std::slice::from_ref(&event)).await;
    let publish = recorder.one(PUBLISH_SPAN);
    assert_eq!(
        links(&publish),
        vec![(trace, producer_span)],
        "the publish span links to the event's context"
    );

    assert_eq!(consume(&delivered[0]).await, Applied::Applied);
    let consumed = recorder.one(CONSUME_SPAN);
    assert_eq!(
        ids(&consumed).0,
        trace,
        "the consumer joins the producer's trace"
    );
    assert_eq!(consumed.parent_span_id, producer_span);
    assert!(consumed.parent_span_is_remote);
    let handler = recorder.one("record_revenue");
    assert_eq!(ids(&handler).0, trace);
    assert_eq!(
        handler.parent_span_id,
        ids(&consumed).1,
        "the handler's span is a child of the consume span"
    );
}

#[tokio::test]
async fn a_batch_links_each_traced_event_and_untraced_ones_add_nothing() {
    let recorder = TraceRecorder::install();
    let traced: Vec<NewEvent> = ["a", "b"]
        .iter()
        .map(|key| tracing::info_span!("request").in_scope(|| invoice_paid(key)))
        .collect();
    let untraced = invoice_paid("c");
    assert_eq!(untraced.headers, Headers::default(), "no span, no context");
    let mut all = traced.clone();
    all.push(untraced);
    relay_all(&all).await;

    let requests: Vec<_> = recorder.named("request").iter().map(ids).collect();
    assert_eq!(requests.len(), 2);
    let mut linked: Vec<_> = recorder
        .named(PUBLISH_SPAN)
        .iter()
        .flat_map(links)
        .collect();
    linked.sort_by_key(|(t, s)| (t.to_string(), s.to_string()));
    let mut expected = requests.clone();
    expected.sort_by_key(|(t, s)| (t.to_string(), s.to_string()));
    assert_eq!(
        linked, expected,
        "one link per traced event, none for the untraced one"
    );
}

#[tokio::test]
async fn a_traceparent_set_by_the_caller_wins_and_a_bad_one_starts_a_new_trace() {
    let recorder = TraceRecorder::install();
    let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let explicit = tracing::info_span!("request").in_scope(|| {
        NewEvent::builder("invoice.paid", "invoice", "inv-1")
            .event_id(EventId::random())
            .payload(&1)
            .traceparent(given)
            .build()
            .unwrap()
    });
    assert_eq!(explicit.headers.traceparent.as_deref(), Some(given));

    let garbled = NewEvent::builder("invoice.paid", "invoice", "inv-2")
        .event_id(EventId::random())
        .payload(&2)
        .traceparent("00-not-a-trace-01")
        .build()
        .unwrap();
    let delivered = relay_all(&[garbled]).await.remove(0);
    assert!(
        links(&recorder.one(PUBLISH_SPAN)).is_empty(),
        "a bad header never fails a publish; it links nothing"
    );
    assert_eq!(
        consume(&delivered).await,
        Applied::Applied,
        "a bad header never fails a delivery"
    );
    let consumed = recorder.one(CONSUME_SPAN);
    assert!(consumed.span_context.is_valid());
    assert_eq!(
        consumed.parent_span_id,
        opentelemetry::trace::SpanId::INVALID,
        "a root span of its own"
    );
}

/// Each publish is a trace of its own: no parent (not the relay's lifetime
/// span `outbox_relay`, which lasts as long as the process and would make
/// one relay one endless trace), two batches two traces.
#[tokio::test]
async fn each_publish_is_a_trace_root_not_a_child_of_the_relays_lifetime() {
    use outbox_core::opentelemetry::trace::SpanId;
    let recorder = TraceRecorder::install();
    // Two keys in two batches of one (the suite's relay takes 16; one
    // event per key and a batch size of 1 force two calls).
    let events = [invoice_paid("a"), invoice_paid("b")];
    let store = Arc::new(MemoryStore::new());
    store.enqueue(&events).await.unwrap();
    let publisher = Arc::new(RecordingPublisher::new());
    let mut config = relay_suite::config("roots");
    config.batch_size = 1;
    let relay = Relay::new(store, publisher.clone(), config).unwrap();
    let shutdown = CancellationToken::new();
    let task = relay.spawn(shutdown.clone());
    tokio::time::timeout(DEADLINE, publisher.wait_for_deliveries(2))
        .await
        .expect("the relay publishes");
    shutdown.cancel();
    task.await.unwrap().unwrap();

    let publishes = recorder.named(PUBLISH_SPAN);
    assert_eq!(publishes.len(), 2);
    for publish in &publishes {
        assert_eq!(publish.parent_span_id, SpanId::INVALID, "a root span");
    }
    assert_ne!(ids(&publishes[0]).0, ids(&publishes[1]).0, "two traces");
    let lifetime = recorder.one("outbox_relay");
    assert!(
        publishes.iter().all(|p| ids(p).0 != ids(&lifetime).0),
        "no publish in the relay's lifetime trace"
    );
}
