//! [`KafkaConsumer`]: a consumer-group runner that feeds an [`InboxStore`].
//!
//! receive → begin → inbox claim → handler(tx) → commit → commit the offset.
//! Offsets are committed manually, only after the handler's transaction
//! committed (or the message was dead-lettered), so a crash or rebalance in
//! between redelivers the message and the inbox absorbs it. Messages are
//! handled one at a time; a failing handler is retried in place with backoff,
//! then the message goes to `{topic}{dead_letter_suffix}` with its original
//! headers and the error. Nothing is ever committed past a message that was
//! neither applied nor dead-lettered. Per-key order reaches the handler: a
//! key lives in one partition and a partition is read in order, and the
//! consumer never moves past the message in hand: a retryable inbox-store
//! error or a failing dead-letter write is waited out on that same message.
//!
//! **Offsets.** After a message is applied (or dead-lettered) its offset is
//! *stored*; the run loop commits stored offsets every `commit_interval`
//! (asynchronously: a failure is logged and counted by [`CommitWatch`] and
//! the next commit retries it). Graceful shutdown commits the last stored
//! offset of every partition it owns, confirms with the group coordinator
//! that it holds them (committing again until it does, for up to
//! [`SHUTDOWN_COMMIT_LIMIT`]) and logs what it committed at info level.
//! A partition the group hands back at an offset behind this consumer's own
//! position (its session was lost, or a rebalance came before the last
//! commit) resumes at its own position: the consumer seeks there, stores
//! it for the next commit, and passes over older messages it already
//! applied ([`KafkaCounts::resumed`], `skipped_behind`), instead of
//! sending each to its inbox again.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::consume::{
    Applied, Consuming, Handled, default_store_outage, pause_unless_shut_down,
};
use outbox_core::relay::OutagePolicy;
use outbox_core::{InboxStore, RetryPolicy};
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{BorrowedMessage, Header, Headers as _, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

pub use outbox_core::consume::HandlerError;

/// The handler a runner calls: [`outbox_core::consume::Handler`] over [`KafkaEvent`].
pub use outbox_core::consume::Handler;

mod event;
pub use event::*;

mod commit;
pub use commit::*;

/// Consumer settings.
#[derive(Clone, Debug)]
pub struct KafkaConsumerConfig {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Consumer group (also the inbox's consumer name).
    pub group_id: String,
    /// Topics to subscribe to.
    pub topics: Vec<String>,
    /// In-place retries of a failing handler.
    pub handler_retry: RetryPolicy,
    /// Pauses while the inbox's store is unavailable or a dead letter cannot
    /// be written; the same message is retried until it works (default
    /// 100 ms doubling to 5 s).
    pub store_outage: OutagePolicy,
    /// How often stored offsets are committed (`auto.commit.interval.ms`).
    /// Default 1 s: at most this much is redelivered after a crash.
    pub commit_interval: Duration,
    /// Dead letters go to `{topic}{suffix}`. Default `.dlq`.
    pub dead_letter_suffix: String,
    /// Any librdkafka setting, applied last (TLS, SASL, …).
    pub librdkafka: Vec<(String, String)>,
}

impl KafkaConsumerConfig {
    /// Defaults for `group_id` reading `topics`.
    pub fn new(
        bootstrap_servers: impl Into<String>,
        group_id: impl Into<String>,
        topics: Vec<String>,
    ) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            group_id: group_id.into(),
            topics,
            handler_retry: RetryPolicy::in_place(),
            store_outage: default_store_outage(),
            commit_interval: Duration::from_secs(1),
            dead_letter_suffix: ".dlq".into(),
            librdkafka: Vec::new(),
        }
    }

    /// Checks the settings can work (the consumer's constructor calls it).
    pub fn validate(&self) -> Result<(), ConsumerError> {
        let fail = |m: &str| Err(ConsumerError::Config(m.to_owned()));
        crate::config::check_bootstrap_servers(&self.bootstrap_servers)
            .map_err(ConsumerError::Config)?;
        if self.group_id.is_empty() {
            return fail("group_id must not be empty");
        }
        if self.topics.is_empty() || self.topics.iter().any(String::is_empty) {
            return fail("at least one topic, and no empty topic names");
        }
        if self.dead_letter_suffix.is_empty() {
            return fail("dead_letter_suffix must not be empty (dead letters would loop back)");
        }
        if self.commit_interval.is_zero() {
            return fail("commit_interval must be non-zero");
        }
        outbox_core::consume::validate_policies(&self.handler_retry, &self.store_outage)
            .map_err(ConsumerError::Config)
    }
}

/// What a consumer did, returned when it stops.
pub type ConsumerReport = outbox_core::consume::ConsumerReport<KafkaCounts>;

/// What a Kafka consumer counts beside every consumer's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KafkaCounts {
    /// Partitions whose last offset the graceful shutdown committed.
    pub committed_at_shutdown: u64,
    /// Times a partition came back to this consumer at an offset behind its
    /// own position (a lost group session or a rebalance before the last
    /// commit) and it resumed at its own position instead.
    pub resumed: u64,
    /// Messages behind its own position it passed over meanwhile (it had
    /// applied or dead-lettered each already).
    pub skipped_behind: u64,
}

outbox_core::consumer_error!(
    /// Kafka failed in a way the consumer cannot ride out.
    Kafka(KafkaError),
    "kafka: {0}"
);

impl From<KafkaError> for ConsumerError {
    fn from(error: KafkaError) -> Self {
        Self::Kafka(error)
    }
}

/// Reads a consumer group and applies each event once through an inbox.
pub struct KafkaConsumer<I, H> {
    /// Shared with the blocking task that asks the coordinator for the
    /// committed offsets at shutdown.
    consumer: Arc<StreamConsumer<CommitWatch>>,
    dead_letters: FutureProducer,
    config: KafkaConsumerConfig,
    consuming: Consuming<I, H>,
    report: ConsumerReport,
    /// The next offset to read of each partition, as stored after the last
    /// message handled there: what the shutdown commit commits.
    stored: std::collections::BTreeMap<(String, i32), i64>,
    /// Partitions handed back behind `stored`, sought forward and not yet
    /// read at their own position again.
    resuming: std::collections::BTreeSet<(String, i32)>,
}

impl<I, H> KafkaConsumer<I, H>
where
    I: InboxStore,
    H: Handler<I::Transaction, KafkaEvent>,
{
    /// A consumer with `config`; subscribes when run. Fails on settings
    /// that cannot work.
    pub fn new(config: KafkaConsumerConfig, inbox: I, handler: H) -> Result<Self, ConsumerError> {
        config.validate()?;
        let mut consumer = ClientConfig::new();
        // Offsets are stored by hand after each message is applied, and only
        // stored offsets are committed: by the run loop every
        // commit_interval (asynchronously, results watched) and at shutdown.
        // Not librdkafka's auto-commit: its commit on close waits for the
        // group coordinator without bound after a connection cut.
        consumer
            .set("bootstrap.servers", &config.bootstrap_servers)
            .set("group.id", &config.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest");
        let mut producer = ClientConfig::new();
        producer
            .set("bootstrap.servers", &config.bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all");
        crate::config::reconnect_promptly(&mut consumer);
        crate::config::reconnect_promptly(&mut producer);
        for (key, value) in &config.librdkafka {
            consumer.set(key, value);
            producer.set(key, value);
        }
        Ok(Self {
            consumer: Arc::new(consumer.create_with_context(CommitWatch::default())?),
            dead_letters: producer.create()?,
            consuming: Consuming::new(inbox, handler, &config.handler_retry, &config.store_outage),
            config,
            report: ConsumerReport::default(),
            stored: std::collections::BTreeMap::new(),
            resuming: std::collections::BTreeSet::new(),
        })
    }

    /// Runs until `shutdown`; the message in hand is finished first.
    pub async fn run(
        mut self,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError> {
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        self.consumer.subscribe(&topics)?;
        let mut last_commit = tokio::time::Instant::now();
        let mut uncommitted = false;
        loop {
            if uncommitted && last_commit.elapsed() >= self.config.commit_interval {
                // Asynchronous: a failure is logged by CommitWatch and the
                // next commit (of the same or later offsets) retries it.
                match self.consumer.commit_consumer_state(CommitMode::Async) {
                    Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
                    Err(error) => tracing::warn!(%error, "offset commit failed; retrying later"),
                }
                last_commit = tokio::time::Instant::now();
                uncommitted = false;
            }
            let message = tokio::select! {
                message = self.consumer.recv() => message,
                _ = shutdown.cancelled() => break,
                // Wake up to commit what was stored even when nothing arrives.
                _ = tokio::time::sleep(self.config.commit_interval), if uncommitted => continue,
            };
            let message = match message {
                Ok(message) => message,
                Err(error) => {
                    // Transport trouble: librdkafka reconnects; wait and read again.
                    tracing::warn!(%error, "kafka receive failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let partition = (message.topic().to_owned(), message.partition());
            match self.stored.get(&partition) {
                Some(&next) if message.offset() < next => {
                    if self.resume_at(partition, next) {
                        uncommitted = true;
                    }
                    continue;
                }
                _ => {
                    self.resuming.remove(&partition);
                }
            }
            let handled = match KafkaEvent::decode(&message) {
                Ok(event) => {
                    let mut applier = self.consuming.applier(&self.config.group_id, &shutdown);
                    let applied = applier.apply(event.event_id, &event.headers, &event).await;
                    self.report.store_retries += applier.store_retries;
                    match applied? {
                        Applied::Applied => Handled::Applied,
                        Applied::Duplicate => Handled::Duplicate,
                        Applied::Interrupted => Handled::Interrupted,
                        Applied::GaveUp(reason) => {
                            self.dead_letter_until_written(&message, &reason, &shutdown)
                                .await?
                        }
                    }
                }
                Err(reason) => {
                    self.dead_letter_until_written(&message, &reason, &shutdown)
                        .await?
                }
            };
            if !self.report.count(handled) {
                break;
            }
            // Only now: the effect committed, or the message was dead-lettered.
            self.consumer.store_offset_from_message(&message)?;
            uncommitted = true;
            self.stored.insert(partition, message.offset() + 1);
        }
        self.report.broker.committed_at_shutdown = self.commit_at_shutdown().await;
        Ok(self.report)
    }

    /// A message of `partition` behind this consumer's own position `next`:
    /// it applied (or dead-lettered) everything before `next` there, and the
    /// group handed the partition back at an older committed offset (its
    /// session was lost, or a rebalance came before the last commit).
    /// Passes the message over; the first time, seeks to `next` and stores
    /// it, so the next commit hands the position on to whoever reads the
    /// partition after. Returns whether it stored an offset.
    fn resume_at(&mut self, partition: (String, i32), next: i64) -> bool {
        self.report.broker.skipped_behind += 1;
        let (topic, number) = (partition.0.clone(), partition.1);
        if !self.resuming.insert(partition) {
            return false;
        }
        self.report.broker.resumed += 1;
        tracing::info!(%topic, partition = number, next, "partition handed back behind this consumer's position; resuming at its own");
        // Asynchronous (no wait): messages already fetched still arrive and
        // are passed over one by one.
        if let Err(error) = self
            .consumer
            .seek(&topic, number, Offset::Offset(next), Duration::ZERO)
        {
            tracing::debug!(%error, %topic, partition = number, "seek failed; passing over the older messages instead");
        }
        let mut position = TopicPartitionList::new();
        position
            .add_partition_offset(&topic, number, Offset::Offset(next))
            .and_then(|()| self.consumer.store_offsets(&position))
            .inspect_err(|error| tracing::debug!(%error, "storing the resumed position failed"))
            .is_ok()
    }

    /// Dead-letters `message`, retrying a failed write in place (the offset
    /// must not move past a message that is neither applied nor
    /// dead-lettered); a non-retryable failure ends the consumer.
    async fn dead_letter_until_written(
        &self,
        message: &BorrowedMessage<'_>,
        reason: &str,
        shutdown: &CancellationToken,
    ) -> Result<Handled, ConsumerError> {
        let mut failures = 0u32;
        loop {
            let error = match dead_letter(&self.dead_letters, &self.config, message, reason).await {
                Ok(()) => return Ok(Handled::DeadLettered),
                Err(ConsumerError::Kafka(error)) => error,
                Err(other) => return Err(other),
            };
            // A dead-letter topic that is missing or refuses the message
            // needs a person; anything else is waited out.
            if crate::error::classify(&error, false) == outbox_core::ErrorClass::Permanent {
                return Err(ConsumerError::Kafka(error));
            }
            failures += 1;
            let pause = self.consuming.outage_pause(failures);
            tracing::warn!(%error, ?pause, "dead-letter write failed; retrying the same message");
            if !pause_unless_shut_down(pause, shutdown).await {
                return Ok(Handled::Interrupted);
            }
        }
    }

    /// Commits the stored offset of every assigned partition and confirms
    /// with the group coordinator (up to [`SHUTDOWN_COMMIT_LIMIT`]) that it
    /// holds them, committing again until it does. Never a blocking commit:
    /// after a connection cut librdkafka may still be looking for the
    /// coordinator, and a synchronous commit then waits without bound. The
    /// consumer is polled meanwhile so the commit is served; messages it
    /// hands out are neither handled nor stored (the next owner reads them).
    /// Returns the partitions whose last offset was confirmed.
    async fn commit_at_shutdown(&self) -> u64 {
        if self.stored.is_empty() {
            tracing::info!("consumer stopped; no offsets to commit");
            return 0;
        }
        let deadline = tokio::time::Instant::now() + SHUTDOWN_COMMIT_LIMIT;
        // A cut can cost this member its partitions until the group settles
        // again; wait that long (bounded) before deciding they went elsewhere.
        let rejoin_by = tokio::time::Instant::now() + SHUTDOWN_COMMIT_LIMIT / 3;
        let mut attempt = 0u32;
        while tokio::time::Instant::now() < deadline {
            let positions = match self.stored_positions() {
                Ok(positions) => positions,
                Err(error) => {
                    tracing::debug!(%error, "cannot read the assignment yet");
                    TopicPartitionList::new()
                }
            };
            if positions.count() == 0 {
                if tokio::time::Instant::now() >= rejoin_by {
                    tracing::info!(
                        "consumer stopped; its partitions are no longer assigned to it, nothing to commit"
                    );
                    return 0;
                }
                // Serves the rebalance; a message handed out is not stored.
                let _ =
                    tokio::time::timeout(Duration::from_millis(300), self.consumer.recv()).await;
                continue;
            }
            attempt += 1;
            if let Err(error) = self.consumer.commit(&positions, CommitMode::Async) {
                tracing::warn!(%error, attempt, "committing the last offsets failed; retrying");
            }
            // Serves the commit (and its callback) for a moment.
            let _ = tokio::time::timeout(Duration::from_millis(300), self.consumer.recv()).await;
            // The coordinator's answer to a commit, through the callback:
            // confirmation without another round trip.
            if confirmed_by_callback(self.consumer.context(), &positions) {
                tracing::info!(
                    partitions = positions.count(),
                    "consumer stopped; last offsets committed (confirmed by the coordinator's reply)"
                );
                return positions.count() as u64;
            }
            // Asks the coordinator what it holds: a call that blocks for up
            // to a second, so on a blocking thread, not an async worker.
            let (consumer, asked) = (self.consumer.clone(), positions.clone());
            let query = tokio::task::spawn_blocking(move || {
                consumer.committed_offsets(asked, Duration::from_secs(1))
            });
            let held = match query.await {
                Ok(held) => held,
                // The runtime is shutting down: nothing is confirmed.
                Err(_) => Err(KafkaError::Canceled),
            };
            match held {
                Ok(held) if holds(&held, &positions) => {
                    let committed: Vec<String> = positions
                        .elements()
                        .iter()
                        .map(|e| format!("{}/{}@{:?}", e.topic(), e.partition(), e.offset()))
                        .collect();
                    tracing::info!(?committed, "consumer stopped; last offsets committed");
                    return positions.count() as u64;
                }
                Ok(_) => tracing::debug!(attempt, "last offsets not confirmed yet"),
                Err(error) => {
                    tracing::debug!(%error, attempt, "cannot confirm the last offsets yet")
                }
            }
        }
        tracing::error!(
            limit = ?SHUTDOWN_COMMIT_LIMIT,
            "could not commit the last offsets; their messages will be redelivered (the inbox absorbs them)"
        );
        0
    }

    /// The stored (next-to-read) offset of each partition still assigned
    /// to this consumer. Not librdkafka's position: that already counts the
    /// message in hand, which an interrupted wait left unhandled.
    fn stored_positions(&self) -> Result<TopicPartitionList, KafkaError> {
        let assigned = self.consumer.assignment()?;
        let mut positions = TopicPartitionList::new();
        for ((topic, partition), next) in &self.stored {
            let owned = assigned
                .elements()
                .iter()
                .any(|a| a.topic() == topic && a.partition() == *partition);
            if owned {
                positions.add_partition_offset(topic, *partition, Offset::Offset(*next))?;
            }
        }
        Ok(positions)
    }
}

/// Sends the message, its original headers and the error to the dead-letter
/// topic, and waits for the delivery (the offset is committed only after).
async fn dead_letter(
    producer: &FutureProducer,
    config: &KafkaConsumerConfig,
    message: &BorrowedMessage<'_>,
    reason: &str,
) -> Result<(), ConsumerError> {
    let topic = format!("{}{}", message.topic(), config.dead_letter_suffix);
    let mut headers = OwnedHeaders::new();
    if let Some(original) = message.headers() {
        for header in original.iter() {
            headers = headers.insert(Header {
                key: header.key,
                value: header.value,
            });
        }
    }
    let origin = format!(
        "{}/{}/{}",
        message.topic(),
        message.partition(),
        message.offset()
    );
    headers = headers
        .insert(Header {
            key: "dlq.error",
            value: Some(reason.as_bytes()),
        })
        .insert(Header {
            key: "dlq.origin",
            value: Some(origin.as_bytes()),
        });
    let mut record = FutureRecord::to(&topic)
        .payload(message.payload().unwrap_or_default())
        .headers(headers);
    if let Some(key) = message.key() {
        record = record.key(key);
    }
    producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| ConsumerError::Kafka(e))?;
    tracing::error!(%origin, %reason, "message dead-lettered");
    Ok(())
}
