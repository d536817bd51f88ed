//! [`SnsPublisher`]: `PublishBatch` requests of at most 10 entries and
//! 256 KiB, sent concurrently, one classified outcome per event.

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use futures::StreamExt;
use outbox_core::{
    ErrorClass, PublishError, PublishOutcome, Publisher, PublisherCapabilities, StoredEvent,
};

use crate::attributes::{DATA_TYPE, attributes_size, message_attributes};
use crate::config::{TopicRouter, is_fifo};
use crate::error::{classify_code, classify_sdk_error, describe};

/// Most entries in one `PublishBatch` request (an SNS limit).
pub const MAX_ENTRIES_PER_REQUEST: usize = 10;
/// Most bytes of one message, and of one request's messages together,
/// attributes included (an SNS limit: 256 KiB).
pub const MAX_REQUEST_BYTES: usize = 256 * 1024;

/// Publishes to SNS topics. The topic is chosen by a [`TopicRouter`] over
/// the event type; the message body is the payload's JSON text, attributes
/// carry the event's identity and headers ([`crate::attributes`]).
///
/// On a FIFO topic (name ending `.fifo`) each message has `MessageGroupId`
/// = partition key and `MessageDeduplicationId` = event id, so SNS drops a
/// republished duplicate within its five-minute window and keeps a key's
/// events in order for FIFO subscribers.
#[derive(Clone, Debug)]
pub struct SnsPublisher {
    client: aws_sdk_sns::Client,
    router: TopicRouter,
    requests_in_flight: usize,
}

/// One event ready to send, and where its outcome goes.
struct Entry {
    index: usize,
    bytes: usize,
    entry: PublishBatchRequestEntry,
}

/// One `PublishBatch` request's worth of entries for one topic.
struct Chunk {
    topic: String,
    bytes: usize,
    entries: Vec<Entry>,
}

type Outcomes = Vec<(usize, PublishOutcome)>;

impl SnsPublisher {
    /// A publisher with the endpoint, region, credentials, retry and
    /// timeout settings of `config` (from `aws_config::load_from_env()` or
    /// built by hand; an `endpoint_url` reaches an emulator).
    pub fn new(config: &aws_types::SdkConfig, router: TopicRouter) -> Self {
        Self::from_client(aws_sdk_sns::Client::new(config), router)
    }

    /// A publisher on a client the caller built.
    pub fn from_client(client: aws_sdk_sns::Client, router: TopicRouter) -> Self {
        Self {
            client,
            router,
            requests_in_flight: 10,
        }
    }

    /// How many `PublishBatch` requests one publish call sends at once
    /// (default 10, so the relay hands over up to 100 events per call).
    pub fn with_requests_in_flight(mut self, requests: usize) -> Self {
        self.requests_in_flight = requests.max(1);
        self
    }

    /// The topic `event_type` goes to.
    pub fn topic_for(&self, event_type: &str) -> &str {
        self.router.topic_for(event_type)
    }

    /// The request entry for `event`, or why it can never be sent.
    fn entry(&self, index: usize, topic: &str, event: &StoredEvent) -> Result<Entry, PublishError> {
        let attributes = message_attributes(event);
        let bytes = event.payload.len() + attributes_size(&attributes);
        if bytes > MAX_REQUEST_BYTES {
            return Err(PublishError::permanent(format!(
                "message is {bytes} bytes with its attributes, over SNS's limit of {MAX_REQUEST_BYTES}"
            )));
        }
        let mut builder = PublishBatchRequestEntry::builder()
            .id(index.to_string())
            .message(event.payload.as_str());
        for (name, value) in attributes {
            let value = MessageAttributeValue::builder()
                .data_type(DATA_TYPE)
                .string_value(value)
                .build()
                .map_err(|e| PublishError::permanent(format!("attribute {name}: {e}")))?;
            builder = builder.message_attributes(name, value);
        }
        if is_fifo(topic) {
            builder = builder
                .message_group_id(event.partition_key.as_str())
                .message_deduplication_id(event.event_id.to_string());
        }
        let entry = builder
            .build()
            .map_err(|e| PublishError::permanent(format!("request entry: {e}")))?;
        Ok(Entry {
            index,
            bytes,
            entry,
        })
    }

    /// Groups entries by topic into requests under both SNS limits, keeping
    /// the batch's order within each topic.
    fn chunks(&self, batch: &[&StoredEvent], outcomes: &mut Outcomes) -> Vec<Chunk> {
        let mut chunks: Vec<Chunk> = Vec::new();
        for (index, event) in batch.iter().enumerate() {
            let topic = self.router.topic_for(&event.event_type);
            let entry = match self.entry(index, topic, event) {
                Ok(entry) => entry,
                Err(error) => {
                    outcomes.push((index, Err(error)));
                    continue;
                }
            };
            let open = chunks.iter_mut().rev().find(|c| c.topic == topic);
            match open {
                Some(chunk)
                    if chunk.entries.len() < MAX_ENTRIES_PER_REQUEST
                        && chunk.bytes + entry.bytes <= MAX_REQUEST_BYTES =>
                {
                    chunk.bytes += entry.bytes;
                    chunk.entries.push(entry);
                }
                _ => chunks.push(Chunk {
                    topic: topic.to_owned(),
                    bytes: entry.bytes,
                    entries: vec![entry],
                }),
            }
        }
        chunks
    }

    /// Sends one request; a request refused as invalid as a whole is sent
    /// again one entry at a time, so only the bad entry fails.
    fn send(&self, chunk: Chunk) -> Pin<Box<dyn Future<Output = Outcomes> + Send + '_>> {
        Box::pin(async move {
            let requests: Vec<PublishBatchRequestEntry> =
                chunk.entries.iter().map(|e| e.entry.clone()).collect();
            let sent = self
                .client
                .publish_batch()
                .topic_arn(&chunk.topic)
                .set_publish_batch_request_entries(Some(requests))
                .send()
                .await;
            match sent {
                Ok(output) => {
                    let failed = output.failed();
                    let succeeded = output.successful();
                    chunk
                        .entries
                        .iter()
                        .map(|entry| {
                            let id = entry.index.to_string();
                            let outcome = if let Some(f) = failed.iter().find(|f| f.id() == id) {
                                let class = classify_code(f.code());
                                let class = if class == ErrorClass::Permanent && !f.sender_fault() {
                                    ErrorClass::Transient
                                } else {
                                    class
                                };
                                Err(PublishError::new(
                                    class,
                                    format!(
                                        "SNS refused the entry: {}: {}",
                                        f.code(),
                                        f.message().unwrap_or("")
                                    ),
                                ))
                            } else if succeeded.iter().any(|s| s.id() == Some(id.as_str())) {
                                Ok(())
                            } else {
                                Err(PublishError::transient(
                                    "SNS returned no result for the entry",
                                ))
                            };
                            (entry.index, outcome)
                        })
                        .collect()
                }
                Err(error) => {
                    let class = classify_sdk_error(&error);
                    if class == ErrorClass::Permanent && chunk.entries.len() > 1 {
                        tracing::debug!(error = %describe(&error), "PublishBatch refused; sending its entries one by one");
                        let mut outcomes = Vec::with_capacity(chunk.entries.len());
                        for entry in chunk.entries {
                            let single = Chunk {
                                topic: chunk.topic.clone(),
                                bytes: entry.bytes,
                                entries: vec![entry],
                            };
                            outcomes.extend(self.send(single).await);
                        }
                        return outcomes;
                    }
                    let message = format!("PublishBatch to {}: {}", chunk.topic, describe(&error));
                    chunk
                        .entries
                        .iter()
                        .map(|e| (e.index, Err(PublishError::new(class, message.clone()))))
                        .collect()
                }
            }
        })
    }
}

#[async_trait]
impl Publisher for SnsPublisher {
    fn capabilities(&self) -> PublisherCapabilities {
        PublisherCapabilities {
            max_batch: MAX_ENTRIES_PER_REQUEST * self.requests_in_flight,
            // Entries of one request succeed or fail independently (a
            // refused entry does not stop a later one of its group), and
            // requests run concurrently: the relay must send a key's events
            // in successive calls.
            preserves_key_order: false,
        }
    }

    /// `sns <topic ARN>`.
    fn destination(&self) -> String {
        format!("sns {}", self.router.describe())
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let mut outcomes: Outcomes = Vec::with_capacity(batch.len());
        let chunks = self.chunks(batch, &mut outcomes);
        let sent: Vec<Outcomes> = futures::stream::iter(chunks)
            .map(|chunk| self.send(chunk))
            .buffer_unordered(self.requests_in_flight)
            .collect()
            .await;
        outcomes.extend(sent.into_iter().flatten());
        outcomes.sort_by_key(|(index, _)| *index);
        debug_assert_eq!(outcomes.len(), batch.len());
        outcomes.into_iter().map(|(_, outcome)| outcome).collect()
    }
}
