//! [`RedisConsumer`]: a consumer-group runner that feeds an [`InboxStore`].
//!
//! receive (`XREADGROUP`) → begin → inbox claim → handler(tx) → commit →
//! `XACK`. An entry is acknowledged only after its transaction committed; a
//! consumer that dies in between leaves it pending, another consumer reclaims
//! it with `XAUTOCLAIM` after `reclaim_idle`, and the inbox absorbs the
//! redelivery. New entries are applied up to `apply_batch` to a
//! transaction and acknowledged with one `XACK` (one commit for many
//! effects: a consumer's rate is its commits).
//!
//! **Ordering.** One consumer handles entries one at a time in stream order,
//! retrying a failing entry in place (with backoff) before moving on, so a
//! key's events reach the handler in order within a stream. That holds
//! through faults too: a retryable inbox-store error is waited out on the
//! same entry, and after any Redis error (and at start-up) the consumer first
//! re-reads its *own* pending entries (`XREADGROUP … 0`), in stream order,
//! before it asks for new ones, so a batch cut short by a broker blip is
//! finished before anything newer is handled. A key's events
//! stay in one stream only if their event types route there (see
//! [`crate::StreamRouter::route`]). Several consumers in one group share a
//! stream's entries and do not keep per-key order among themselves; entries
//! reclaimed from a dead consumer arrive after newer ones.

use std::collections::HashMap;

use outbox_core::consume::{Applied, Applier, Consuming, Handled, pause_unless_shut_down};
use outbox_core::{ErrorClass, EventId, Headers, InboxStore};
use redis::aio::ConnectionManager;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands, RedisError, Value};
use tokio_util::sync::CancellationToken;

use crate::connection::{ConnectionSettings, LazyConnection};
use crate::fields::StreamEvent;

pub use outbox_core::consume::HandlerError;

/// The handler a runner calls: [`outbox_core::consume::Handler`] over [`StreamEvent`].
pub use outbox_core::consume::Handler;

mod config;
pub use config::*;

/// Which entries the next read asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reading {
    /// This consumer's own pending entries (`0`): at start-up and after any
    /// error, so a batch cut short is finished before anything newer.
    OwnPending,
    /// New entries (`>`).
    New,
}

/// Reads a consumer group and applies each event once through an inbox.
pub struct RedisConsumer<I, H> {
    connection: LazyConnection,
    config: ConsumerConfig,
    consuming: Consuming<I, H>,
    report: ConsumerReport,
    reading: Reading,
}

impl<I, H> RedisConsumer<I, H>
where
    I: InboxStore,
    H: Handler<I::Transaction, StreamEvent>,
{
    /// A consumer on its own `connection` (blocking reads would stall other
    /// users of a shared one); fails on settings that cannot work.
    pub fn new(
        connection: ConnectionManager,
        config: ConsumerConfig,
        inbox: I,
        handler: H,
    ) -> Result<Self, ConsumerError> {
        Self::on(LazyConnection::ready(connection), config, inbox, handler)
    }

    /// A consumer of the server at `url`, built without connecting: it
    /// can be built (and started) while Redis is down, and waits the
    /// outage out like any other, with the default connection settings.
    /// A malformed URL fails here.
    pub fn from_url(
        url: &str,
        config: ConsumerConfig,
        inbox: I,
        handler: H,
    ) -> Result<Self, ConsumerError> {
        Self::from_url_with(url, ConnectionSettings::default(), config, inbox, handler)
    }

    /// [`Self::from_url`] with explicit connection settings (the response
    /// timeout must be longer than `config.block`).
    pub fn from_url_with(
        url: &str,
        settings: ConnectionSettings,
        config: ConsumerConfig,
        inbox: I,
        handler: H,
    ) -> Result<Self, ConsumerError> {
        if settings.response_timeout <= config.block {
            return Err(ConsumerError::Config(format!(
                "the response timeout ({:?}) must be longer than a blocking read ({:?})",
                settings.response_timeout, config.block
            )));
        }
        let connection = LazyConnection::open(url, settings).map_err(ConsumerError::Redis)?;
        Self::on(connection, config, inbox, handler)
    }

    fn on(
        connection: LazyConnection,
        config: ConsumerConfig,
        inbox: I,
        handler: H,
    ) -> Result<Self, ConsumerError> {
        config.validate()?;
        Ok(Self {
            connection,
            consuming: Consuming::new(inbox, handler, &config.handler_retry, &config.store_outage),
            config,
            report: ConsumerReport::default(),
            reading: Reading::OwnPending,
        })
    }

    /// The connection, made now if there is none yet (refused or timed
    /// out: an outage the run loop waits out).
    async fn redis(&self) -> Result<ConnectionManager, RedisError> {
        self.connection.get().await
    }

    /// Creates the group on every stream (from the beginning) if missing.
    pub async fn ensure_groups(&mut self) -> Result<(), ConsumerError> {
        for stream in &self.config.streams {
            let created: Result<(), RedisError> = self
                .redis()
                .await?
                .xgroup_create_mkstream(stream, &self.config.group, "0")
                .await;
            match created {
                Err(e) if e.code() == Some("BUSYGROUP") => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Runs until `shutdown`: the entry in hand is finished first (or, if
    /// it is waiting out an outage, left pending to be delivered again).
    /// Redis errors and retryable inbox-store errors are waited out; a
    /// non-retryable one ends the consumer with it.
    pub async fn run(
        mut self,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError> {
        let mut groups_ready = false;
        while !shutdown.is_cancelled() {
            let step = if groups_ready {
                self.step(&shutdown).await
            } else {
                self.ensure_groups().await.map(|()| groups_ready = true)
            };
            let error = match step {
                Ok(()) => {
                    self.consuming.step_succeeded();
                    continue;
                }
                Err(ConsumerError::Redis(e)) => e,
                Err(other) => return Err(other),
            };
            // Whatever was cut short is pending on this consumer: finish it
            // before reading anything newer.
            self.reading = Reading::OwnPending;
            let class = crate::error::classify(&error);
            if class == ErrorClass::Permanent {
                return Err(ConsumerError::Redis(error));
            }
            self.report.broker.redis_retries += 1;
            let pause = self.consuming.step_failed();
            if class == ErrorClass::Outage {
                tracing::warn!(%error, ?pause, "redis unavailable; consumer waiting");
            } else {
                tracing::warn!(%error, ?pause, "redis command failed; consumer retrying");
            }
            if error.code() == Some("NOGROUP") {
                // The stream or its group vanished (a restart without
                // persistence, a DEL): create them again.
                groups_ready = false;
            }
            pause_unless_shut_down(pause, &shutdown).await;
        }
        Ok(self.report)
    }

    async fn step(&mut self, shutdown: &CancellationToken) -> Result<(), ConsumerError> {
        self.reclaim_idle(shutdown).await?;
        let reading = self.reading;
        let mut options = StreamReadOptions::default()
            .group(&self.config.group, &self.config.consumer)
            .count(self.config.batch_size);
        let position = match reading {
            Reading::OwnPending => "0",
            Reading::New => {
                options = options.block(self.config.block.as_millis().max(1) as usize);
                ">"
            }
        };
        let ids: Vec<&str> = self.config.streams.iter().map(|_| position).collect();
        let read: Option<StreamReadReply> = tokio::select! {
            read = async {
                self.redis().await?.xread_options(&self.config.streams, &ids, &options).await
            } => Some(read?),
            _ = shutdown.cancelled() => None,
        };
        let mut handed = 0usize;
        for key in read.map(|r| r.keys).unwrap_or_default() {
            if reading == Reading::New && self.config.apply_batch > 1 {
                handed += key.ids.len();
                for chunk in key.ids.chunks(self.config.apply_batch) {
                    if !self.process_batch(&key.key, chunk, shutdown).await? {
                        return Ok(());
                    }
                }
                continue;
            }
            for entry in key.ids {
                if shutdown.is_cancelled() {
                    // Left pending: read again (in order) by the next run.
                    return Ok(());
                }
                handed += 1;
                let deliveries = match reading {
                    Reading::OwnPending => self.deliveries(&key.key, &entry.id).await?,
                    Reading::New => 1,
                };
                self.process(&key.key, entry, deliveries, shutdown).await?;
            }
        }
        if reading == Reading::OwnPending && handed == 0 {
            self.reading = Reading::New;
        }
        Ok(())
    }

    /// Takes over entries another consumer left pending past `reclaim_idle`.
    async fn reclaim_idle(&mut self, shutdown: &CancellationToken) -> Result<(), ConsumerError> {
        let idle = self.config.reclaim_idle.as_millis() as usize;
        for stream in self.config.streams.clone() {
            let reply: StreamAutoClaimReply = self
                .redis()
                .await?
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
                self.report.broker.reclaimed += 1;
                let deliveries = self.deliveries(&stream, &entry.id).await?;
                self.process(&stream, entry, deliveries, shutdown).await?;
            }
        }
        Ok(())
    }

    async fn deliveries(&mut self, stream: &str, id: &str) -> Result<usize, ConsumerError> {
        let pending: redis::streams::StreamPendingCountReply = self
            .redis()
            .await?
            .xpending_count(stream, &self.config.group, id, id, 1)
            .await?;
        Ok(pending.ids.first().map(|p| p.times_delivered).unwrap_or(1))
    }

    /// New entries (delivered once), applied in one inbox transaction
    /// (`apply_batch`) and acknowledged with one `XACK`, in stream order. An
    /// entry that does not decode is dead-lettered in its place, between
    /// the batches before and after it. Returns `false` if shutdown left
    /// entries unacknowledged (delivered again later, in order).
    async fn process_batch(
        &mut self,
        stream: &str,
        entries: &[StreamId],
        shutdown: &CancellationToken,
    ) -> Result<bool, ConsumerError> {
        let mut ready: Vec<(&StreamId, StreamEvent)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match StreamEvent::decode(stream, &entry.id, &entry.map) {
                Ok(event) => ready.push((entry, event)),
                Err(_) => {
                    if !self.apply_ready(stream, &mut ready, shutdown).await? {
                        return Ok(false);
                    }
                    // Decodes again, fails again: dead-lettered and acked.
                    self.process(stream, entry.clone(), 1, shutdown).await?;
                }
            }
        }
        self.apply_ready(stream, &mut ready, shutdown).await
    }

    /// Applies `ready` as one batch, then acknowledges what it settled.
    async fn apply_ready(
        &mut self,
        stream: &str,
        ready: &mut Vec<(&StreamId, StreamEvent)>,
        shutdown: &CancellationToken,
    ) -> Result<bool, ConsumerError> {
        if ready.is_empty() {
            return Ok(true);
        }
        if shutdown.is_cancelled() {
            return Ok(false);
        }
        let batch: Vec<(EventId, &Headers, &StreamEvent)> = ready
            .iter()
            .map(|(_, event)| (event.event_id, &event.headers, event))
            .collect();
        let mut applier = self.applier(shutdown);
        let outcomes = applier.apply_batch(&batch).await;
        self.report.store_retries += applier.store_retries;
        let mut settled = Vec::with_capacity(ready.len());
        let mut finished = true;
        for ((entry, _), outcome) in ready.iter().zip(outcomes?) {
            match outcome {
                Applied::Applied => self.report.applied += 1,
                Applied::Duplicate => self.report.duplicates += 1,
                Applied::GaveUp(reason) => {
                    self.dead_letter(stream, entry, &reason, 1).await?;
                    self.report.dead_lettered += 1;
                }
                Applied::Interrupted => {
                    finished = false;
                    break;
                }
            }
            settled.push(entry.id.as_str());
        }
        if !settled.is_empty() {
            // Only now, after the effects committed (or the entries were
            // dead-lettered).
            let _: usize = self
                .redis()
                .await?
                .xack(stream, &self.config.group, &settled)
                .await?;
        }
        ready.clear();
        Ok(finished)
    }

    async fn process(
        &mut self,
        stream: &str,
        entry: StreamId,
        deliveries: usize,
        shutdown: &CancellationToken,
    ) -> Result<(), ConsumerError> {
        let outcome = if deliveries > self.config.max_deliveries {
            let reason = format!("delivered {deliveries} times");
            self.dead_letter(stream, &entry, &reason, deliveries)
                .await?
        } else {
            match StreamEvent::decode(stream, &entry.id, &entry.map) {
                Ok(event) => {
                    self.apply(stream, &entry, &event, deliveries, shutdown)
                        .await?
                }
                Err(e) => {
                    self.dead_letter(stream, &entry, &e.to_string(), deliveries)
                        .await?
                }
            }
        };
        if !self.report.count(outcome) {
            return Ok(());
        }
        // Only now, after the effect committed (or the entry was dead-lettered).
        let _: usize = self
            .redis()
            .await?
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
        shutdown: &CancellationToken,
    ) -> Result<Handled, ConsumerError> {
        let mut applier = self.applier(shutdown);
        let applied = applier.apply(event.event_id, &event.headers, event).await;
        self.report.store_retries += applier.store_retries;
        match applied? {
            Applied::Applied => Ok(Handled::Applied),
            Applied::Duplicate => Ok(Handled::Duplicate),
            Applied::Interrupted => Ok(Handled::Interrupted),
            Applied::GaveUp(reason) => self.dead_letter(stream, entry, &reason, deliveries).await,
        }
    }

    /// The core's applier, over this consumer's inbox, handler and policies.
    fn applier<'a>(&'a self, shutdown: &'a CancellationToken) -> Applier<'a, I, H> {
        self.consuming.applier(&self.config.group, shutdown)
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
        let _: String = self.redis().await?.xadd(&dead, "*", &fields).await?;
        tracing::error!(%stream, entry = %entry.id, %reason, "entry dead-lettered");
        Ok(Handled::DeadLettered)
    }
}
