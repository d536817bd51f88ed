//! Spans recorded through OpenTelemetry's in-memory exporter, for tests that
//! follow one trace from a producer's span to a consumer's handler (feature
//! `otel-testing`).

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt;

/// Installs a `tracing` subscriber that exports every closed span to
/// memory, as this thread's default until dropped. Drive the code under test
/// on a current-thread runtime (`#[tokio::test]`), so the tasks it spawns
/// run on this thread and report here.
pub struct TraceRecorder {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
    _default: tracing::subscriber::DefaultGuard,
}

impl TraceRecorder {
    /// Starts recording on this thread.
    pub fn install() -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-tests"));
        let subscriber = tracing_subscriber::registry().with(layer);
        let default = tracing::subscriber::set_default(subscriber);
        Self {
            exporter,
            provider,
            _default: default,
        }
    }

    /// Every span closed so far.
    pub fn spans(&self) -> Vec<SpanData> {
        self.provider
            .force_flush()
            .expect("flush the in-memory exporter");
        self.exporter
            .get_finished_spans()
            .expect("read the in-memory exporter")
    }

    /// The closed spans called `name`.
    pub fn named(&self, name: &str) -> Vec<SpanData> {
        self.spans()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }

    /// The one closed span called `name`; panics naming what was recorded
    /// if there is none or more than one.
    pub fn one(&self, name: &str) -> SpanData {
        let mut found = self.named(name);
        assert_eq!(
            found.len(),
            1,
            "expected one span {name:?}; recorded: {:?}",
            self.spans().iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        found.remove(0)
    }
}

/// `(trace id, span id)` of a recorded span.
pub fn ids(span: &SpanData) -> (TraceId, SpanId) {
    (span.span_context.trace_id(), span.span_context.span_id())
}

/// `(trace id, span id)` of each span `span` links to.
pub fn links(span: &SpanData) -> Vec<(TraceId, SpanId)> {
    span.links
        .links
        .iter()
        .map(|l| (l.span_context.trace_id(), l.span_context.span_id()))
        .collect()
}

impl TraceRecorder {
    /// Asserts the hop is one trace: the span `producer` (around the
    /// enqueue) is linked from a [`PUBLISH_SPAN`], is the parent of the one
    /// [`CONSUME_SPAN`], and the span `handler` (opened by the handler) is
    /// that span's child. Returns the trace id.
    ///
    /// [`PUBLISH_SPAN`]: crate::trace::PUBLISH_SPAN
    /// [`CONSUME_SPAN`]: crate::trace::CONSUME_SPAN
    pub fn assert_one_trace(&self, producer: &str, handler: &str) -> TraceId {
        let (trace, producer_span) = ids(&self.one(producer));
        let linked = self
            .named(crate::trace::PUBLISH_SPAN)
            .iter()
            .any(|publish| links(publish).contains(&(trace, producer_span)));
        assert!(linked, "no publish span links to the producer's span");
        let consumed = self.one(crate::trace::CONSUME_SPAN);
        assert_eq!(
            ids(&consumed).0,
            trace,
            "the consumer's span is not in the producer's trace"
        );
        assert_eq!(consumed.parent_span_id, producer_span);
        let handled = self.one(handler);
        assert_eq!(ids(&handled).0, trace);
        assert_eq!(
            handled.parent_span_id,
            ids(&consumed).1,
            "the handler's span is not a child of the consume span"
        );
        trace
    }
}

/// Enqueues one `invoice.paid` event through `store` inside a span called
/// `span` (the producer's request), so the event captures its context.
pub async fn enqueue_in_span<W: crate::store::OutboxWriter + ?Sized>(store: &W, span: &str) {
    use tracing::Instrument;
    let request = tracing::info_span!("request", otel.name = span);
    async {
        let paid = crate::NewEvent::builder("invoice.paid", "invoice", "inv-1")
            .event_id(crate::EventId::random())
            .payload(&serde_json::json!({ "amount_cents": 1200 }))
            .build()
            .expect("a valid event");
        store.enqueue(&[paid]).await.expect("enqueue");
    }
    .instrument(request)
    .await;
}
