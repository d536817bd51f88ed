//! Metric names every consumer runner reports through (the `metrics`
//! facade; labelled by `consumer`, the inbox's consumer name).

/// Counter: deliveries settled, labelled by `outcome`: `applied`,
/// `duplicate` (a redelivery the inbox absorbed), `gave_up` (the
/// runner dead-letters it), `interrupted` (shutdown; delivered again).
pub const DELIVERIES: &str = "outbox_consumer_deliveries_total";
/// Counter: handler failures retried in place.
pub const HANDLER_RETRIES: &str = "outbox_consumer_handler_retries_total";
/// Counter: retryable inbox-store errors waited out on the same event.
pub const STORE_RETRIES: &str = "outbox_consumer_store_retries_total";
/// Histogram: seconds per handler call.
pub const HANDLER_SECONDS: &str = "outbox_consumer_handler_seconds";

/// Bucket bounds of [`HANDLER_SECONDS`]: the relay's
/// ([`SECONDS_BUCKETS`](crate::relay::metrics::SECONDS_BUCKETS)).
pub const HISTOGRAM_BUCKETS: [(&str, &[f64]); 1] =
    [(HANDLER_SECONDS, crate::relay::metrics::SECONDS_BUCKETS)];

/// Registers the help text and unit of every consumer metric with the
/// installed recorder (Prometheus prints them as `# HELP`).
pub fn describe() {
    use ::metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(
        DELIVERIES,
        Unit::Count,
        "Deliveries settled, per consumer and outcome (applied, duplicate, gave_up, interrupted)."
    );
    describe_counter!(
        HANDLER_RETRIES,
        Unit::Count,
        "Handler failures retried in place, per consumer."
    );
    describe_counter!(
        STORE_RETRIES,
        Unit::Count,
        "Retryable inbox-store errors waited out on the same event, per consumer."
    );
    describe_histogram!(HANDLER_SECONDS, Unit::Seconds, "Seconds per handler call.");
}

pub(super) fn delivery(consumer: &str, outcome: &'static str) {
    ::metrics::counter!(DELIVERIES, "consumer" => consumer.to_owned(), "outcome" => outcome)
        .increment(1);
}

pub(super) fn count(name: &'static str, consumer: &str) {
    ::metrics::counter!(name, "consumer" => consumer.to_owned()).increment(1);
}

pub(super) fn handler_seconds(consumer: &str, elapsed: std::time::Duration) {
    ::metrics::histogram!(HANDLER_SECONDS, "consumer" => consumer.to_owned())
        .record(elapsed.as_secs_f64());
}
