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
//! key lives in one partition and a partition is read in order.

use std::time::Duration;

use outbox_core::consume::{Applied, apply_once};
use outbox_core::policy::SplitMix64;
use outbox_core::{EventId, Headers, InboxStore, RetryPolicy, StoreError};
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers as _, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_util::sync::CancellationToken;

use crate::headers::names;

/// An event as the consumer hands it to the handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaEvent {
    /// Topic, partition and offset it was read at.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
    /// From the `event_id` header.
    pub event_id: EventId,
    /// From the `event_type` header.
    pub event_type: String,
    /// The message key.
    pub partition_key: String,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// Correlation, causation, trace context and free headers.
    pub headers: Headers,
}

impl KafkaEvent {
    fn decode(message: &BorrowedMessage<'_>) -> Result<Self, String> {
        let mut event_id = None;
        let mut event_type = None;
        let mut pairs = Vec::new();
        if let Some(headers) = message.headers() {
            for header in headers.iter() {
                let value = String::from_utf8(header.value.unwrap_or_default().to_vec())
                    .map_err(|e| format!("header {}: {e}", header.key))?;
                match header.key {
                    names::EVENT_ID => {
                        event_id = Some(value.parse().map_err(|e| format!("event_id: {e}"))?)
                    }
                    names::EVENT_TYPE => event_type = Some(value),
                    names::AGGREGATE_TYPE | names::AGGREGATE_ID | names::PAYLOAD_VERSION => {}
                    other => pairs.push((other.to_owned(), value)),
                }
            }
        }
        Ok(Self {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            event_id: event_id.ok_or("no event_id header")?,
            event_type: event_type.ok_or("no event_type header")?,
            partition_key: message
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .unwrap_or_default(),
            payload: message.payload().unwrap_or_default().to_vec(),
            headers: Headers::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        })
    }
}

pub use outbox_core::consume::HandlerError;

/// The handler a runner calls: [`outbox_core::consume::Handler`] over [`KafkaEvent`].
pub use outbox_core::consume::Handler;

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
            dead_letter_suffix: ".dlq".into(),
            librdkafka: Vec::new(),
        }
    }
}

/// What a consumer did, returned when it stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerReport {
    /// Effects committed.
    pub applied: u64,
    /// Redeliveries the inbox recognised.
    pub duplicates: u64,
    /// Messages sent to a dead-letter topic.
    pub dead_lettered: u64,
}

/// Why a consumer stopped.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// Kafka failed in a way the consumer cannot ride out.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
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
pub struct KafkaConsumer<I, H> {
    consumer: StreamConsumer,
    dead_letters: FutureProducer,
    config: KafkaConsumerConfig,
    inbox: I,
    handler: H,
    random: SplitMix64,
    report: ConsumerReport,
}

impl<I, H> KafkaConsumer<I, H>
where
    I: InboxStore,
    H: Handler<I::Transaction, KafkaEvent>,
{
    /// A consumer with `config`; subscribes when run.
    pub fn new(config: KafkaConsumerConfig, inbox: I, handler: H) -> Result<Self, KafkaError> {
        let mut consumer = ClientConfig::new();
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
        for (key, value) in &config.librdkafka {
            consumer.set(key, value);
            producer.set(key, value);
        }
        Ok(Self {
            consumer: consumer.create()?,
            dead_letters: producer.create()?,
            config,
            inbox,
            handler,
            random: SplitMix64::from_entropy(),
            report: ConsumerReport::default(),
        })
    }

    /// Runs until `shutdown`; the message in hand is finished first.
    pub async fn run(
        mut self,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError> {
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        self.consumer.subscribe(&topics)?;
        loop {
            let message = tokio::select! {
                message = self.consumer.recv() => message,
                _ = shutdown.cancelled() => break,
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
            let handled = match KafkaEvent::decode(&message) {
                Ok(event) => {
                    let handler = &self.handler;
                    let applied = apply_once(
                        &self.inbox,
                        &self.config.group_id,
                        event.event_id,
                        &event,
                        handler,
                        &self.config.handler_retry,
                        &self.random,
                    )
                    .await?;
                    match applied {
                        Applied::Applied => Handled::Applied,
                        Applied::Duplicate => Handled::Duplicate,
                        Applied::GaveUp(reason) => {
                            dead_letter(&self.dead_letters, &self.config, &message, &reason)
                                .await?;
                            Handled::DeadLettered
                        }
                    }
                }
                Err(reason) => {
                    dead_letter(&self.dead_letters, &self.config, &message, &reason).await?;
                    Handled::DeadLettered
                }
            };
            match handled {
                Handled::Applied => self.report.applied += 1,
                Handled::Duplicate => self.report.duplicates += 1,
                Handled::DeadLettered => self.report.dead_lettered += 1,
            }
            // Only now: the effect committed, or the message was dead-lettered.
            self.consumer.commit_message(&message, CommitMode::Async)?;
        }
        if let Err(error) = self.consumer.commit_consumer_state(CommitMode::Sync) {
            tracing::debug!(%error, "final offset commit");
        }
        Ok(self.report)
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
