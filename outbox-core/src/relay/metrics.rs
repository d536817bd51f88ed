//! Metric names and recording, through the `metrics` facade.

use std::time::Duration;

use crate::store::RelayId;

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

pub(super) fn count(name: &'static str, relay: &RelayId, n: u64) {
    if n > 0 {
        metrics::counter!(name, "relay" => relay.to_string()).increment(n);
    }
}

pub(super) fn count_failed(relay: &RelayId, cause: &'static str) {
    metrics::counter!(FAILED, "relay" => relay.to_string(), "cause" => cause).increment(1);
}

pub(super) fn seconds(name: &'static str, relay: &RelayId, elapsed: Duration) {
    metrics::histogram!(name, "relay" => relay.to_string()).record(elapsed.as_secs_f64());
}

pub(super) fn batch_size(relay: &RelayId, n: usize) {
    metrics::histogram!(BATCH_SIZE, "relay" => relay.to_string()).record(n as f64);
}

pub(super) fn paused(relay: &RelayId, on: bool) {
    metrics::gauge!(PAUSED, "relay" => relay.to_string()).set(if on { 1.0 } else { 0.0 });
}

pub(super) fn publisher_outage(destination: &str, on: bool) {
    metrics::gauge!(PUBLISHER_OUTAGE, "destination" => destination.to_owned()).set(if on {
        1.0
    } else {
        0.0
    });
}
