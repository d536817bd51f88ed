//! What a [`RedisConsumer`](super::RedisConsumer) is told (its settings) and
//! what it tells back (its report and errors).

use std::time::Duration;

use outbox_core::RetryPolicy;
use outbox_core::consume::default_store_outage;
use outbox_core::relay::OutagePolicy;
use redis::RedisError;

/// Consumer settings.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// Consumer group (also the inbox's consumer name).
    pub group: String,
    /// This consumer's name within the group.
    pub consumer: String,
    /// Streams to read.
    pub streams: Vec<String>,
    /// Entries per read. Default 64.
    pub batch_size: usize,
    /// New entries applied in one inbox transaction, acknowledged with one
    /// `XACK`: one commit for up to this many effects instead of one each
    /// (a consumer's rate is bounded by its commits; 1 applies each alone).
    /// If a handler fails or the store errs, the batch rolls back and its
    /// entries are applied one at a time, each with its own retries and
    /// give-up, so the handler may see an entry of it twice, the first
    /// time rolled back. Entries re-read after an error are applied one at
    /// a time. Default 32.
    pub apply_batch: usize,
    /// How long a read blocks waiting for entries. Default 200 ms; the
    /// connection's response timeout must be longer.
    pub block: Duration,
    /// Pending entries idle this long are reclaimed from their consumer. Default 30 s.
    pub reclaim_idle: Duration,
    /// Deliveries after which an entry goes to the dead-letter stream. Default 10.
    pub max_deliveries: usize,
    /// In-place retries of a failing handler.
    pub handler_retry: RetryPolicy,
    /// Pauses while the inbox's store is unavailable; the same entry is
    /// retried until the store is back (default 100 ms doubling to 5 s).
    pub store_outage: OutagePolicy,
    /// Dead letters go to `{stream}{suffix}`. Default `:dead`.
    pub dead_letter_suffix: String,
}

impl ConsumerConfig {
    /// Defaults for `group`/`consumer` reading `streams`.
    pub fn new(
        group: impl Into<String>,
        consumer: impl Into<String>,
        streams: Vec<String>,
    ) -> Self {
        Self {
            group: group.into(),
            consumer: consumer.into(),
            streams,
            batch_size: 64,
            apply_batch: 32,
            block: Duration::from_millis(200),
            reclaim_idle: Duration::from_secs(30),
            max_deliveries: 10,
            handler_retry: RetryPolicy::in_place(),
            store_outage: default_store_outage(),
            dead_letter_suffix: ":dead".into(),
        }
    }

    /// Checks the settings can work (the consumer's constructor calls it).
    pub fn validate(&self) -> Result<(), ConsumerError> {
        let fail = |m: String| Err(ConsumerError::Config(m));
        if self.group.is_empty() || self.consumer.is_empty() {
            return fail("group and consumer names must not be empty".into());
        }
        if self.streams.is_empty() || self.streams.iter().any(String::is_empty) {
            return fail("at least one stream, and no empty stream names".into());
        }
        if self.batch_size == 0 {
            return fail("batch_size must be at least 1".into());
        }
        if self.apply_batch == 0 {
            return fail("apply_batch must be at least 1 (1 applies each entry alone)".into());
        }
        // BLOCK 0 would wait forever; the connection's response timeout
        // must also be longer than a blocking read.
        if self.block.is_zero() {
            return fail("block must be non-zero (Redis reads BLOCK 0 as forever)".into());
        }
        if self.reclaim_idle.is_zero() {
            return fail("reclaim_idle must be non-zero".into());
        }
        if self.max_deliveries == 0 {
            return fail("max_deliveries must be at least 1".into());
        }
        if self.dead_letter_suffix.is_empty() {
            return fail(
                "dead_letter_suffix must not be empty (dead letters would loop back)".into(),
            );
        }
        outbox_core::consume::validate_policies(&self.handler_retry, &self.store_outage)
            .map_err(ConsumerError::Config)
    }
}

/// What a consumer did, returned when it stops.
pub type ConsumerReport = outbox_core::consume::ConsumerReport<RedisCounts>;

/// What a Redis consumer counts beside every consumer's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisCounts {
    /// Entries reclaimed from idle consumers.
    pub reclaimed: u64,
    /// Redis errors ridden out (the consumer waited and re-read its pending entries).
    pub redis_retries: u64,
}

outbox_core::consumer_error!(
    /// Redis failed.
    Redis(RedisError),
    "redis: {0}"
);

impl From<RedisError> for ConsumerError {
    fn from(error: RedisError) -> Self {
        Self::Redis(error)
    }
}
