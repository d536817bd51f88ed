//! The dead letters of one SQS dead-letter queue (where
//! [`SqsConsumer`](crate::SqsConsumer) puts what it gave up on, each
//! wrapped with its error): list, show and replay them.
//!
//! SQS cannot be read without receiving, so `list` and `show` receive the
//! queue's messages and make each visible again at once (visibility 0);
//! a dead letter's id is its message id in the dead-letter queue.
//!
//! A replay sends the original body and attributes to the queue the
//! consumer read it from (`source_queue`, with its message group on a FIFO
//! queue and `replay-<id>` as deduplication id), then deletes the dead
//! letter. The record travels with the replayed message as attributes
//! (`dlq.replayed_by`, `dlq.replay_reason`, `dlq.replayed_from`), is
//! printed by the CLI, and shows among the headers of a new dead letter if
//! the consumer gives up on it again. **Once:** the replaying operator holds
//! the dead letter received (invisible to others for
//! [`HOLD`]) until it is deleted, so a second operator finds nothing to
//! replay; a replay that fails between send and delete leaves the dead
//! letter to reappear (the consumer's inbox applies the event at most once).

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::SdkError;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, Message, MessageAttributeValue,
    MessageSystemAttributeName,
};
use outbox_core::chrono::{TimeZone, Utc};
use outbox_core::dead_letter::{
    DeadLetter, DeadLetterQueue, METADATA_PREFIX, Replay, ReplayRefused,
};
use outbox_core::serde_json::{self, Value};

use crate::attributes::names;
use crate::config::is_fifo;
use crate::error::describe;

/// How long a list, show or replay holds the messages it received before
/// making them visible again (a replay deletes its own first).
pub const HOLD: Duration = Duration::from_secs(30);

/// Receives at most this many messages while looking for one (SQS hands
/// out up to 10 per call).
const SCAN_LIMIT: usize = 10_000;

/// Why reading or replaying dead letters failed.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// The replay was refused; nothing was sent.
    #[error(transparent)]
    Refused(#[from] ReplayRefused),
    /// SQS failed.
    #[error("sqs: {0}")]
    Sqs(String),
    /// A list asked to start after a dead letter: SQS has no order to page
    /// by (raise the limit instead).
    #[error("SQS has no order to page dead letters by; raise the limit instead")]
    Unordered,
    /// A message in the dead-letter queue is not a consumer's wrapper.
    #[error("dead letter {id} is not a consumer's wrapper: {reason}")]
    Unwrapped {
        /// The message id.
        id: String,
        /// What is wrong.
        reason: String,
    },
}

fn sqs<E>(error: SdkError<E>) -> DeadLetterError
where
    E: aws_sdk_sqs::error::ProvideErrorMetadata + std::error::Error + 'static,
{
    DeadLetterError::Sqs(describe(&error))
}

/// The dead letters of one dead-letter queue.
#[derive(Clone, Debug)]
pub struct SqsDeadLetters {
    client: Client,
    queue_url: String,
}

impl SqsDeadLetters {
    /// The dead letters in the queue at `dead_letter_queue_url`.
    pub fn new(client: Client, dead_letter_queue_url: &str) -> Self {
        Self {
            client,
            queue_url: dead_letter_queue_url.to_owned(),
        }
    }
}

#[async_trait::async_trait]
impl DeadLetterQueue for SqsDeadLetters {
    type Error = DeadLetterError;

    fn location(&self) -> String {
        self.queue_url.clone()
    }

    /// Up to `limit` dead letters (SQS gives no order; sorted by the time
    /// they were dead-lettered). Messages that are not a consumer's
    /// wrapper are listed with their body as the error.
    async fn list(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, DeadLetterError> {
        if after.is_some() {
            return Err(DeadLetterError::Unordered);
        }
        let held = self.receive(limit, None).await?;
        let mut listed: Vec<DeadLetter> = held.iter().map(read_dead_letter).collect();
        self.release(&held).await?;
        listed.sort_by_key(|d| d.dead_lettered_at);
        Ok(listed)
    }

    /// The dead letter `id`, if the queue has it.
    async fn get(&self, id: &str) -> Result<Option<DeadLetter>, DeadLetterError> {
        let held = self.receive(SCAN_LIMIT, Some(id)).await?;
        let found = held
            .iter()
            .find(|m| m.message_id() == Some(id))
            .map(read_dead_letter);
        self.release(&held).await?;
        Ok(found)
    }

    /// Sends the dead letter `id` back to its source queue, once, recording
    /// `operator` and `reason`, and deletes it.
    async fn replay_attributed(
        &self,
        id: &str,
        operator: &str,
        reason: &str,
    ) -> Result<Replay, DeadLetterError> {
        let held = self.receive(SCAN_LIMIT, Some(id)).await?;
        let (found, others): (Vec<Message>, Vec<Message>) =
            held.into_iter().partition(|m| m.message_id() == Some(id));
        self.release(&others).await?;
        let Some(message) = found.into_iter().next() else {
            return Err(ReplayRefused::NotFound(id.to_owned()).into());
        };
        let result = self.send_back(id, &message, operator, reason).await;
        if result.is_err() {
            self.release(std::slice::from_ref(&message)).await?;
        }
        result
    }
}

impl SqsDeadLetters {
    async fn send_back(
        &self,
        id: &str,
        message: &Message,
        operator: &str,
        reason: &str,
    ) -> Result<Replay, DeadLetterError> {
        let wrapper = wrapper(message)?;
        let source = wrapper["source_queue"]
            .as_str()
            .ok_or_else(|| unwrapped(id, "no source_queue"))?;
        let body = wrapper["body"]
            .as_str()
            .ok_or_else(|| unwrapped(id, "no body"))?;
        let mut attributes: HashMap<String, MessageAttributeValue> = HashMap::new();
        let string = |value: &str| {
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .expect("a string attribute has its type and value")
        };
        for (name, value) in wrapper["attributes"].as_object().into_iter().flatten() {
            if let (false, Some(value)) = (name.starts_with(METADATA_PREFIX), value.as_str()) {
                attributes.insert(name.clone(), string(value));
            }
        }
        attributes.insert("dlq.replayed_by".into(), string(operator));
        attributes.insert("dlq.replay_reason".into(), string(reason));
        attributes.insert("dlq.replayed_from".into(), string(id));
        let mut send = self
            .client
            .send_message()
            .queue_url(source)
            .message_body(body)
            .set_message_attributes(Some(attributes));
        if is_fifo(source) {
            let group = wrapper["group_id"]
                .as_str()
                .or_else(|| wrapper["attributes"][names::PARTITION_KEY].as_str())
                .unwrap_or("outbox-replays");
            send = send
                .message_group_id(group)
                .message_deduplication_id(format!("replay-{id}"));
        }
        let sent = send.send().await.map_err(sqs)?;
        let at = Utc::now();
        if let Some(receipt) = message.receipt_handle() {
            self.client
                .delete_message()
                .queue_url(&self.queue_url)
                .receipt_handle(receipt)
                .send()
                .await
                .map_err(sqs)?;
        }
        Ok(Replay {
            operator: operator.to_owned(),
            reason: reason.to_owned(),
            at,
            new_id: sent.message_id().unwrap_or_default().to_owned(),
        })
    }

    /// Receives up to `limit` distinct messages, held for [`HOLD`]; stops
    /// early at `wanted` or when a receive comes back empty.
    async fn receive(
        &self,
        limit: usize,
        wanted: Option<&str>,
    ) -> Result<Vec<Message>, DeadLetterError> {
        let mut held: Vec<Message> = Vec::new();
        let mut empty_receives = 0;
        while held.len() < limit && empty_receives < 2 {
            let received = self
                .client
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages((limit - held.len()).min(10) as i32)
                .visibility_timeout(HOLD.as_secs() as i32)
                .wait_time_seconds(if empty_receives == 0 { 0 } else { 1 })
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(sqs)?;
            let messages = received.messages.unwrap_or_default();
            if messages.is_empty() {
                empty_receives += 1;
                continue;
            }
            for message in messages {
                let known = held.iter().any(|m| m.message_id() == message.message_id());
                if !known {
                    held.push(message);
                }
            }
            if wanted.is_some_and(|id| held.iter().any(|m| m.message_id() == Some(id))) {
                break;
            }
        }
        Ok(held)
    }

    /// Makes `messages` visible again at once.
    async fn release(&self, messages: &[Message]) -> Result<(), DeadLetterError> {
        for chunk in messages.chunks(10) {
            let entries: Vec<ChangeMessageVisibilityBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(m.receipt_handle()?)
                        .visibility_timeout(0)
                        .build()
                        .ok()
                })
                .collect();
            if entries.is_empty() {
                continue;
            }
            self.client
                .change_message_visibility_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(sqs)?;
        }
        Ok(())
    }
}

fn unwrapped(id: &str, reason: &str) -> DeadLetterError {
    DeadLetterError::Unwrapped {
        id: id.to_owned(),
        reason: reason.to_owned(),
    }
}

fn wrapper(message: &Message) -> Result<Value, DeadLetterError> {
    let id = message.message_id().unwrap_or_default();
    let value: Value = serde_json::from_str(message.body().unwrap_or_default())
        .map_err(|e| unwrapped(id, &e.to_string()))?;
    if !value.is_object() {
        return Err(unwrapped(id, "not a JSON object"));
    }
    Ok(value)
}

/// A dead-letter queue message as the model: the wrapper's fields, the
/// event's identity from its attributes (raw delivery) or SNS envelope.
fn read_dead_letter(message: &Message) -> DeadLetter {
    let id = message.message_id().unwrap_or_default().to_owned();
    let dead_lettered_at = message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::SentTimestamp))
        .and_then(|ms| ms.parse::<i64>().ok())
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single());
    let Ok(wrapper) = wrapper(message) else {
        return DeadLetter {
            id,
            source: String::new(),
            error: "not a consumer's dead letter".into(),
            deliveries: None,
            dead_lettered_at,
            event_id: None,
            event_type: None,
            partition_key: None,
            headers: Vec::new(),
            payload: message.body().unwrap_or_default().as_bytes().to_vec(),
            replayed: None,
        };
    };
    let body = wrapper["body"].as_str().unwrap_or_default();
    // Raw delivery: the attributes are the event's; enveloped: SNS's JSON
    // notification carries them and the payload as its `Message`.
    let envelope: Option<Value> = serde_json::from_str::<Value>(body)
        .ok()
        .filter(|v| v.get("Type").is_some() && v.get("Message").is_some());
    let mut headers: Vec<(String, String)> = match &envelope {
        Some(envelope) => envelope["MessageAttributes"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v["Value"].as_str()?.to_owned())))
            .collect(),
        None => wrapper["attributes"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect(),
    };
    let payload = match &envelope {
        Some(envelope) => envelope["Message"].as_str().unwrap_or_default().to_owned(),
        None => body.to_owned(),
    };
    // A `dlq.replayed_by` attribute stays: this dead letter is an earlier
    // replay the consumer gave up on again.
    headers.sort();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    DeadLetter {
        source: wrapper["source_queue"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        error: wrapper["error"].as_str().unwrap_or_default().to_owned(),
        deliveries: wrapper["receive_count"].as_u64(),
        dead_lettered_at,
        event_id: header(names::EVENT_ID),
        event_type: header(names::EVENT_TYPE),
        partition_key: header(names::PARTITION_KEY)
            .or_else(|| wrapper["group_id"].as_str().map(str::to_owned)),
        payload: payload.into_bytes(),
        // A replayed dead letter is deleted: what is listed was not.
        replayed: None,
        headers,
        id,
    }
}
