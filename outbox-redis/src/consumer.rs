//! [`RedisConsumer`]: a consumer-group runner that feeds an [`InboxStore`].
//!
//! receive (`XREADGROUP`) → begin → inbox claim → handler(tx) → commit →
//! `XACK`. An entry is acknowledged only after its transaction committed; a
//! consumer that dies in between leaves it pending, another consumer reclaims
//! it with `XAUTOCLAIM` after `reclaim_idle`, and the inbox absorbs the
//! redelivery.
//!
//! **Ordering.** One consumer handles entries one at a time in stream order,
//! retrying a failing entry in place (with backoff) before moving on, so a
//! key's events reach the handler in order within a stream. A key's events
//! stay in one stream only if their event types route there (see
//! [`crate::StreamRouter::route`]). Several consumers in one group share a
//! stream's entries and do not keep per-key order among themselves; entries
//! reclaimed from a dead consumer arrive after newer ones.

use std::collections::HashMap;
use std::time::Duration;

use outbox_core::consume::{Applied, apply_once};
use outbox_core::policy::SplitMix64;
use outbox_core::{ErrorClass, InboxStore, RetryPolicy, StoreError};
use redis::aio::ConnectionManager;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands, RedisError, Value};
use tokio_util::sync::CancellationToken;

use crate::fields::StreamEvent;

pub use outbox_core::consume::HandlerError;

/// The handler a runner calls: [`outbox_core::consume::Handler`] over [`StreamEvent`].
pub use outbox_core::consume::Handler;

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
    /// How long a read blocks waiting for entries. Default 200 ms; the
    /// connection's response timeout must be longer.
    pub block: Duration,
    /// Pending entries idle this long are reclaimed from their consumer. Default 30 s.
    pub reclaim_idle: Duration,
    /// Deliveries after which an entry goes to the dead-letter stream. Default 10.
    pub max_deliveries: usize,
    /// In-place retries of a failing handler.
    pub handler_retry: RetryPolicy,
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
            block: Duration::from_millis(200),
            reclaim_idle: Duration::from_secs(30),
            max_deliveries: 10,
            handler_retry: RetryPolicy::in_place(),
            dead_letter_suffix: ":dead".into(),
        }
    }
}

/// What a consumer did, returned when it stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerReport {
    /// Effects committed.
    pub applied: u64,
    /// Redeliveries the inbox recognised (acknowledged without effect).
    pub duplicates: u64,
    /// Entries moved to a dead-letter stream.
    pub dead_lettered: u64,
    /// Entries reclaimed from idle consumers.
    pub reclaimed: u64,
}

/// Why a consumer stopped.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// The inbox's store failed with a non-retryable error.
    #[error("inbox: {0}")]
    Inbox(#[from] StoreError),
}

enum Handled {
    Applied,
    Duplicate,
    DeadLettered,
}

/// Reads a consumer group and applies each event once through an inbox.
pub struct RedisConsumer<I, H> {
    connection: ConnectionManager,
    config: ConsumerConfig,
    inbox: I,
    handler: H,
    random: SplitMix64,
    report: ConsumerReport,
}

impl<I, H> RedisConsumer<I, H>
where
    I: InboxStore,
    H: Handler<I::Transaction, StreamEvent>,
{
    /// A consumer on its own `connection` (blocking reads would stall other
    /// users of a shared one).
    pub fn new(
        connection: ConnectionManager,
        config: ConsumerConfig,
        inbox: I,
        handler: H,
    ) -> Self {
        Self {
            connection,
            config,
            inbox,
            handler,
            random: SplitMix64::from_entropy(),
            report: ConsumerReport::default(),
        }
    }

    /// Creates the group on every stream (from the beginning) if missing.
    pub async fn ensure_groups(&mut self) -> Result<(), ConsumerError> {
        for stream in &self.config.streams {
            let created: Result<(), RedisError> = self
                .connection
                .xgroup_create_mkstream(stream, &self.config.group, "0")
                .await;
            match created {
                Err(e) if e.code() == Some("BUSYGROUP") => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Runs until `shutdown`: the entry in hand is finished first.
    pub async fn run(
        mut self,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError> {
        self.ensure_groups().await?;
        while !shutdown.is_cancelled() {
            match self.step(&shutdown).await {
                Ok(()) => {}
                // The connection manager reconnects; wait and read again.
                Err(ConsumerError::Redis(e))
                    if crate::error::classify(&e) != ErrorClass::Permanent =>
                {
                    tracing::warn!(error = %e, "redis unavailable; consumer waiting");
                    tokio::select! {
                        _ = tokio::time::sleep(self.config.block) => {}
                        _ = shutdown.cancelled() => {}
                    }
                    if let Err(e) = self.ensure_groups().await {
                        tracing::warn!(error = %e, "cannot recreate consumer groups yet");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.report)
    }

    async fn step(&mut self, shutdown: &CancellationToken) -> Result<(), ConsumerError> {
        {
            self.reclaim_idle().await?;
            let options = StreamReadOptions::default()
                .group(&self.config.group, &self.config.consumer)
                .count(self.config.batch_size)
                .block(self.config.block.as_millis() as usize);
            let ids: Vec<&str> = self.config.streams.iter().map(|_| ">").collect();
            let read: Option<StreamReadReply> = tokio::select! {
                read = self.connection.xread_options(&self.config.streams, &ids, &options) => Some(read?),
                _ = shutdown.cancelled() => None,
            };
            for key in read.map(|r| r.keys).unwrap_or_default() {
                for entry in key.ids {
                    self.process(&key.key, entry, 1).await?;
                }
            }
        }
        Ok(())
    }

    /// Takes over entries another consumer left pending past `reclaim_idle`.
    async fn reclaim_idle(&mut self) -> Result<(), ConsumerError> {
        let idle = self.config.reclaim_idle.as_millis() as usize;
        for stream in self.config.streams.clone() {
            let reply: StreamAutoClaimReply = self
                .connection
                .xautoclaim_options(
                    &stream,
                    &self.config.group,
                    &self.config.consumer,
                    idle,
                    "0-0",
                    StreamAutoClaimOptions::default().count(self.config.batch_size),
                )
                .await?;
            for entry in reply.claimed {
                self.report.reclaimed += 1;
                let deliveries = self.deliveries(&stream, &entry.id).await?;
                self.process(&stream, entry, deliveries).await?;
            }
        }
        Ok(())
    }

    async fn deliveries(&mut self, stream: &str, id: &str) -> Result<usize, ConsumerError> {
        let pending: redis::streams::StreamPendingCountReply = self
            .connection
            .xpending_count(stream, &self.config.group, id, id, 1)
            .await?;
        Ok(pending.ids.first().map(|p| p.times_delivered).unwrap_or(1))
    }

    async fn process(
        &mut self,
        stream: &str,
        entry: StreamId,
        deliveries: usize,
    ) -> Result<(), ConsumerError> {
        let outcome = if deliveries > self.config.max_deliveries {
            let reason = format!("delivered {deliveries} times");
            self.dead_letter(stream, &entry, &reason, deliveries)
                .await?
        } else {
            match StreamEvent::decode(stream, &entry.id, &entry.map) {
                Ok(event) => self.apply(stream, &entry, &event, deliveries).await?,
                Err(e) => {
                    self.dead_letter(stream, &entry, &e.to_string(), deliveries)
                        .await?
                }
            }
        };
        match outcome {
            Handled::Applied => self.report.applied += 1,
            Handled::Duplicate => self.report.duplicates += 1,
            Handled::DeadLettered => self.report.dead_lettered += 1,
        }
        // Only now, after the effect committed (or the entry was dead-lettered).
        let _: usize = self
            .connection
            .xack(stream, &self.config.group, &[&entry.id])
            .await?;
        Ok(())
    }

    async fn apply(
        &mut self,
        stream: &str,
        entry: &StreamId,
        event: &StreamEvent,
        deliveries: usize,
    ) -> Result<Handled, ConsumerError> {
        let handler = &self.handler;
        let applied = apply_once(
            &self.inbox,
            &self.config.group,
            event.event_id,
            event,
            handler,
            &self.config.handler_retry,
            &self.random,
        )
        .await?;
        match applied {
            Applied::Applied => Ok(Handled::Applied),
            Applied::Duplicate => Ok(Handled::Duplicate),
            Applied::GaveUp(reason) => self.dead_letter(stream, entry, &reason, deliveries).await,
        }
    }

    /// Copies the entry, its error and delivery count to `{stream}{suffix}`.
    async fn dead_letter(
        &mut self,
        stream: &str,
        entry: &StreamId,
        reason: &str,
        deliveries: usize,
    ) -> Result<Handled, ConsumerError> {
        let mut fields: Vec<(String, Vec<u8>)> = entry
            .map
            .iter()
            .filter_map(|(k, v)| match v {
                Value::BulkString(b) => Some((k.clone(), b.clone())),
                _ => None,
            })
            .collect();
        fields.sort();
        let meta: HashMap<&str, String> = HashMap::from([
            ("dlq.error", reason.to_owned()),
            ("dlq.deliveries", deliveries.to_string()),
            ("dlq.entry_id", entry.id.clone()),
            ("dlq.stream", stream.to_owned()),
            ("dlq.group", self.config.group.clone()),
        ]);
        for (k, v) in meta {
            fields.push((k.to_owned(), v.into_bytes()));
        }
        let dead = format!("{stream}{}", self.config.dead_letter_suffix);
        let _: String = self.connection.xadd(&dead, "*", &fields).await?;
        tracing::error!(%stream, entry = %entry.id, %reason, "entry dead-lettered");
        Ok(Handled::DeadLettered)
    }
}
