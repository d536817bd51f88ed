//! Metric names and recording, through the `metrics` facade.
//!
//! Every series a relay writes exists from its start (counters at 0, each
//! failure cause included), so a rate or an alert has a series before the
//! first event. [`describe`] gives each name its help text and unit, and
//! [`HISTOGRAM_BUCKETS`] the bucket bounds an exporter should use, so
//! latencies are histograms that sum across replicas, not per-process
//! summaries.

use std::time::Duration;

use metrics::Label;

use super::RelayConfig;

/// Counter: events acknowledged as published.
pub const PUBLISHED: &str = "outbox_relay_published_total";
/// Counter: transient failures scheduled for retry.
pub const RETRIED: &str = "outbox_relay_retried_total";
/// Counter: events moved to failed, labelled by `cause`.
pub const FAILED: &str = "outbox_relay_failed_total";
/// Counter: settlements refused because another claim holds the row.
pub const FENCED: &str = "outbox_relay_fenced_total";
/// Counter: leases returned without an outcome.
pub const RELEASED: &str = "outbox_relay_released_total";
/// Counter: broker outages that paused the relay.
pub const OUTAGES: &str = "outbox_relay_outages_total";
/// Counter: store errors the relay backed off from.
pub const STORE_ERRORS: &str = "outbox_relay_store_errors_total";
/// Gauge: 1 while paused for a broker outage.
pub const PAUSED: &str = "outbox_relay_paused";
/// Gauge: 1 while a relay is paused because publishing to `destination`
/// ([`Publisher::destination`](crate::Publisher::destination)) reports an
/// outage, 0 otherwise (present from the relay's start).
pub const PUBLISHER_OUTAGE: &str = "outbox_publisher_outage";
/// Histogram: seconds per publish call.
pub const PUBLISH_SECONDS: &str = "outbox_relay_publish_seconds";
/// Histogram: seconds per claim.
pub const CLAIM_SECONDS: &str = "outbox_relay_claim_seconds";
/// Histogram: events per claimed batch.
pub const BATCH_SIZE: &str = "outbox_relay_batch_size";
/// Histogram: seconds rested after a batch to let other tenants of a
/// fleet be served (see [`Pace`](super::Pace)).
pub const REST_SECONDS: &str = "outbox_relay_rest_seconds";

/// The `cause` labels of [`FAILED`]: a permanent publish error, retries
/// used up, a crash loop (claimed too often without an outcome), a row the
/// relay could not read.
pub const FAILED_CAUSES: [&str; 4] = [
    "permanent",
    "attempts_exhausted",
    "crash_loop",
    "unreadable",
];

/// Bucket bounds of [`PUBLISH_SECONDS`] and [`CLAIM_SECONDS`], in seconds:
/// 1 ms to 30 s, about ×2.5 apart (a claim is single-digit milliseconds, a
/// publish to a broker up to its timeout).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Bucket bounds of [`BATCH_SIZE`], in events: 1 to 10,000.
pub const BATCH_SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1_000.0, 2_500.0, 5_000.0, 10_000.0,
];

/// Each relay histogram with its bucket bounds, for the exporter's
/// configuration (e.g. `PrometheusBuilder::set_buckets_for_metric`).
pub const HISTOGRAM_BUCKETS: [(&str, &[f64]); 4] = [
    (PUBLISH_SECONDS, SECONDS_BUCKETS),
    (CLAIM_SECONDS, SECONDS_BUCKETS),
    (REST_SECONDS, SECONDS_BUCKETS),
    (BATCH_SIZE, BATCH_SIZE_BUCKETS),
];

/// Registers the help text and unit of every relay metric with the
/// installed recorder (Prometheus prints them as `# HELP`). Call it once,
/// after installing the recorder.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        PUBLISHED,
        Unit::Count,
        "Events acknowledged as published, per relay."
    );
    describe_counter!(
        RETRIED,
        Unit::Count,
        "Transient publish failures scheduled for retry, per relay."
    );
    describe_counter!(
        FAILED,
        Unit::Count,
        "Events moved to failed, per relay and cause (permanent, attempts_exhausted, crash_loop, unreadable)."
    );
    describe_counter!(
        FENCED,
        Unit::Count,
        "Settlements refused because another claim holds the row (a lease lost), per relay."
    );
    describe_counter!(
        RELEASED,
        Unit::Count,
        "Leases returned without an outcome, per relay."
    );
    describe_counter!(
        OUTAGES,
        Unit::Count,
        "Publisher outages that paused the relay, per relay."
    );
    describe_counter!(
        STORE_ERRORS,
        Unit::Count,
        "Store errors the relay backed off from, per relay."
    );
    describe_gauge!(
        PAUSED,
        "1 while the relay is paused by a publisher outage, else 0."
    );
    describe_gauge!(
        PUBLISHER_OUTAGE,
        "1 while publishing to the destination reports an outage, else 0."
    );
    describe_histogram!(
        PUBLISH_SECONDS,
        Unit::Seconds,
        "Seconds per publish call (one batch)."
    );
    describe_histogram!(
        CLAIM_SECONDS,
        Unit::Seconds,
        "Seconds per claim from the store."
    );
    describe_histogram!(BATCH_SIZE, Unit::Count, "Events per claimed batch.");
    describe_histogram!(
        REST_SECONDS,
        Unit::Seconds,
        "Seconds a tenant draining a backlog rested after a batch while other tenants were served."
    );
}

/// A relay's labels: `relay`, and `tenant` when it serves one.
fn labels(relay: &RelayConfig) -> Vec<Label> {
    let mut labels = vec![Label::new("relay", relay.relay_id.to_string())];
    if let Some(tenant) = &relay.tenant {
        labels.push(Label::new("tenant", tenant.clone()));
    }
    labels
}

/// A relay's labels and one more.
fn labels_with(relay: &RelayConfig, key: &'static str, value: &'static str) -> Vec<Label> {
    let mut labels = labels(relay);
    labels.push(Label::new(key, value));
    labels
}

/// Creates every counter of `relay` at 0 (see the module's docs).
pub(super) fn start(relay: &RelayConfig) {
    for name in [PUBLISHED, RETRIED, FENCED, RELEASED, OUTAGES, STORE_ERRORS] {
        metrics::counter!(name, labels(relay)).increment(0);
    }
    for cause in FAILED_CAUSES {
        metrics::counter!(FAILED, labels_with(relay, "cause", cause)).increment(0);
    }
}

pub(super) fn count(name: &'static str, relay: &RelayConfig, n: u64) {
    if n > 0 {
        metrics::counter!(name, labels(relay)).increment(n);
    }
}

pub(super) fn count_failed(relay: &RelayConfig, cause: &'static str) {
    metrics::counter!(FAILED, labels_with(relay, "cause", cause)).increment(1);
}

pub(super) fn seconds(name: &'static str, relay: &RelayConfig, elapsed: Duration) {
    metrics::histogram!(name, labels(relay)).record(elapsed.as_secs_f64());
}

pub(super) fn rested(relay: &RelayConfig, rest: Duration) {
    seconds(REST_SECONDS, relay, rest);
}

pub(super) fn batch_size(relay: &RelayConfig, n: usize) {
    metrics::histogram!(BATCH_SIZE, labels(relay)).record(n as f64);
}

pub(super) fn paused(relay: &RelayConfig, on: bool) {
    metrics::gauge!(PAUSED, labels(relay)).set(if on { 1.0 } else { 0.0 });
}

pub(super) fn publisher_outage(destination: &str, on: bool) {
    metrics::gauge!(PUBLISHER_OUTAGE, "destination" => destination.to_owned()).set(if on {
        1.0
    } else {
        0.0
    });
}
