//! Tracing across the hop: the spans the relay and the consumer runners open,
//! and (feature `otel`) how they join the producer's OpenTelemetry trace.
//!
//! Without `otel` the spans are plain `tracing` spans. With it:
//!
//! * [`NewEventBuilder::build`](crate::NewEvent::builder) captures the
//!   current span's context into [`Headers::traceparent`] (and a non-empty
//!   `tracestate` into the `tracestate` header) unless the caller set one;
//! * the relay's [`PUBLISH_SPAN`], one per publisher call, is a trace root
//!   **linked** to each event's context (a batch has many parents, so
//!   links, not a parent; and not the relay's lifetime span either);
//! * a consumer runner's [`CONSUME_SPAN`], around the inbox claim and the
//!   handler, is a **child** of the event's `traceparent`, so the handler's
//!   own spans land in the producer's trace.
//!
//! Spans reach OpenTelemetry through `tracing-opentelemetry`'s layer, which
//! the application installs (as it does for its own spans).

use crate::event::Headers;

/// The relay's span around one publisher call (fields: `relay`, `events`).
pub const PUBLISH_SPAN: &str = "outbox.publish";
/// A consumer runner's span around one delivery (fields: `consumer`,
/// `event_id`, `event_type` when the runner knows it).
pub const CONSUME_SPAN: &str = "outbox.consume";
/// The free header that carries W3C `tracestate` beside `traceparent`.
pub const TRACESTATE_HEADER: &str = "tracestate";

/// The span around one publisher call: a root of its own (`parent: None`),
/// never a child of the relay's lifetime span (`outbox_relay`), which would
/// make one relay one endless trace; the events' contexts are its links.
pub(crate) fn publish_span<'e>(
    relay: &str,
    events: impl ExactSizeIterator<Item = &'e Headers>,
) -> tracing::Span {
    let span = tracing::info_span!(parent: None, "outbox.publish", relay, events = events.len());
    // Parsing every event's context is wasted on a span nobody records.
    #[cfg(feature = "otel")]
    if !span.is_disabled() {
        otel::link_each(&span, events);
    }
    #[cfg(not(feature = "otel"))]
    drop(events);
    span
}

/// The span around one delivery, a child of the event's trace context.
pub(crate) fn consume_span(
    consumer: &str,
    event_id: &crate::EventId,
    headers: &Headers,
) -> tracing::Span {
    let span = tracing::info_span!("outbox.consume", consumer, %event_id);
    #[cfg(feature = "otel")]
    if !span.is_disabled() {
        otel::adopt_parent(&span, headers);
    }
    #[cfg(not(feature = "otel"))]
    let _ = headers;
    span
}

#[cfg(feature = "otel")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "otel")))]
pub use otel::{current_trace_context, span_context_of};

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TRACESTATE_HEADER;
    use crate::event::Headers;

    /// The current `tracing` span's OpenTelemetry context as
    /// `(traceparent, tracestate)`, or `None` outside a traced span (no
    /// OpenTelemetry layer installed, or no span entered).
    pub fn current_trace_context() -> Option<(String, Option<String>)> {
        let context = tracing::Span::current().context();
        let span = context.span();
        let span_context = span.span_context();
        if !span_context.is_valid() {
            return None;
        }
        let traceparent = format!(
            "00-{}-{}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        );
        let state = span_context.trace_state().header();
        Some((traceparent, (!state.is_empty()).then_some(state)))
    }

    /// The remote span context an event's headers carry, or `None` when
    /// `traceparent` is absent or not a valid W3C version-00 value (a bad
    /// header never fails a publish or a delivery; the span just starts a
    /// trace of its own).
    pub fn span_context_of(headers: &Headers) -> Option<SpanContext> {
        let traceparent = headers.traceparent.as_deref()?;
        let mut parts = traceparent.trim().split('-');
        let (Some(version), Some(trace), Some(span), Some(flags), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let is_hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if version != "00" || !is_hex(trace, 32) || !is_hex(span, 16) || !is_hex(flags, 2) {
            return None;
        }
        let trace_id = TraceId::from_hex(trace).ok()?;
        let span_id = SpanId::from_hex(span).ok()?;
        let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
        let state = headers
            .extra
            .get(TRACESTATE_HEADER)
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let context = SpanContext::new(trace_id, span_id, flags, true, state);
        context.is_valid().then_some(context)
    }

    pub(super) fn link_each<'e>(span: &tracing::Span, events: impl Iterator<Item = &'e Headers>) {
        for headers in events {
            if let Some(context) = span_context_of(headers) {
                span.add_link(context);
            }
        }
    }

    pub(super) fn adopt_parent(span: &tracing::Span, headers: &Headers) {
        if let Some(remote) = span_context_of(headers) {
            let parent = opentelemetry::Context::new().with_remote_span_context(remote);
            // Fails only if the span is already started elsewhere or no
            // OpenTelemetry layer is installed; either way there is nothing
            // to join.
            let _ = span.set_parent(parent);
        }
    }

    /// Fills `traceparent` (and `tracestate`) from the current span unless
    /// the caller set one.
    pub(crate) fn capture_into(headers: &mut Headers) {
        if headers.traceparent.is_some() {
            return;
        }
        if let Some((traceparent, state)) = current_trace_context() {
            headers.traceparent = Some(traceparent);
            if let Some(state) = state {
                headers
                    .extra
                    .entry(TRACESTATE_HEADER.to_owned())
                    .or_insert(state);
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn with(traceparent: &str) -> Headers {
            Headers {
                traceparent: Some(traceparent.to_owned()),
                ..Headers::default()
            }
        }

        #[test]
        fn reads_a_w3c_traceparent_and_its_state() {
            let mut headers = with("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
            headers
                .extra
                .insert(TRACESTATE_HEADER.into(), "vendor=abc".into());
            let context = span_context_of(&headers).unwrap();
            assert_eq!(
                context.trace_id().to_string(),
                "4bf92f3577b34da6a3ce929d0e0e4736"
            );
            assert_eq!(context.span_id().to_string(), "00f067aa0ba902b7");
            assert!(context.is_sampled());
            assert!(context.is_remote());
            assert_eq!(context.trace_state().get("vendor"), Some("abc"));
        }

        #[test]
        fn ignores_what_is_not_a_version_00_traceparent() {
            for bad in [
                "",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx",
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                "00-aa-bb-01",
            ] {
                assert!(span_context_of(&with(bad)).is_none(), "{bad:?}");
            }
            assert!(span_context_of(&Headers::default()).is_none());
        }
    }
}

#[cfg(feature = "otel")]
pub(crate) use otel::capture_into;
