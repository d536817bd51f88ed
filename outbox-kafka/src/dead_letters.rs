//! The dead letters of one topic (`{topic}{suffix}`, where
//! [`KafkaConsumer`](crate::KafkaConsumer) puts what it gave up on): list,
//! show and replay them.
//!
//! A dead letter's id is its `partition/offset` in the dead-letter topic. A
//! replay produces the original key, payload and headers (the `dlq.*`
//! metadata left out) to the topic named by its `dlq.origin` header, where
//! the consumer group reads it as a new message.
//!
//! **Once.** Kafka has no compare-and-set, so the record topic
//! `{topic}{suffix}.replays` (one partition, created on first use) is the
//! arbiter: a replay first appends a claim (the dead letter's id and a
//! nonce of its own), reads the record topic to its end, and goes on only
//! if its claim is the first for that id; then it produces the message and
//! appends the record of the replay (operator, reason, time, new
//! `partition/offset`). Two operators at the same moment: one replays, the
//! other is refused with the first's record. A replay that died between its
//! claim and its record is shown as replayed with no new id (the message
//! may or may not have been produced; the consumer's inbox applies it at
//! most once either way).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_core::chrono::{DateTime, TimeZone, Utc};
use outbox_core::dead_letter::{
    DeadLetter, DeadLetterQueue, METADATA_PREFIX, Replay, ReplayRefused,
};
use outbox_core::event::wire::names;
use outbox_core::serde_json::{self, json};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// How long reading a topic to its end may take.
const READ_LIMIT: Duration = Duration::from_secs(30);

/// Why reading or replaying dead letters failed.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// The replay was refused; nothing was produced.
    #[error(transparent)]
    Refused(#[from] ReplayRefused),
    /// The broker failed.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// Reading a topic to its end took longer than 30 s.
    #[error("reading {0} to its end timed out")]
    TimedOut(String),
}

/// The dead letters of one topic.
#[derive(Clone)]
pub struct KafkaDeadLetters {
    client: ClientConfig,
    topic: String,
    dead: String,
    replays: String,
}

impl KafkaDeadLetters {
    /// The dead letters of `topic`, kept in `{topic}{suffix}` (the
    /// consumer's [`dead_letter_suffix`](crate::KafkaConsumerConfig),
    /// `.dlq` by default), on the cluster at `bootstrap_servers`.
    pub fn new(bootstrap_servers: &str, topic: &str, suffix: &str) -> Self {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", bootstrap_servers);
        let dead = format!("{topic}{suffix}");
        Self {
            client,
            topic: topic.to_owned(),
            replays: format!("{dead}.replays"),
            dead,
        }
    }

    /// Adds a librdkafka setting (TLS, SASL, …) to every client it makes.
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.client.set(key, value);
        self
    }

    /// The topic holding the dead letters.
    pub fn dead_letter_topic(&self) -> &str {
        &self.dead
    }
}

#[async_trait::async_trait]
impl DeadLetterQueue for KafkaDeadLetters {
    type Error = DeadLetterError;

    fn location(&self) -> String {
        self.dead.clone()
    }

    /// Up to `limit` dead letters in (partition, offset) order, after the
    /// dead letter `after` (exclusive) when given.
    async fn list(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let after = after.map(parse_id).transpose()?;
        let (client, dead) = (self.client.clone(), self.dead.clone());
        let messages = blocking(move || read_topic(&client, &dead, after, limit)).await?;
        let records = self.records().await?;
        Ok(messages
            .iter()
            .take(limit)
            .map(|m| self.dead_letter(m, &records))
            .collect())
    }

    /// The dead letter `id` (`partition/offset`), if there is one.
    async fn get(&self, id: &str) -> Result<Option<DeadLetter>, DeadLetterError> {
        let Some(message) = self.message(id).await? else {
            return Ok(None);
        };
        let records = self.records().await?;
        Ok(Some(self.dead_letter(&message, &records)))
    }

    /// Produces the dead letter `id` to its source topic, once, recording
    /// `operator` and `reason`.
    async fn replay_attributed(
        &self,
        id: &str,
        operator: &str,
        reason: &str,
    ) -> Result<Replay, DeadLetterError> {
        let Some(message) = self.message(id).await? else {
            return Err(ReplayRefused::NotFound(id.to_owned()).into());
        };
        if let Some(earlier) = self.records().await?.remove(id) {
            return Err(already(id, earlier));
        }
        self.ensure_record_topic().await?;
        let producer: FutureProducer = self
            .client
            .clone()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()?;
        let nonce = outbox_core::uuid::Uuid::new_v4().to_string();
        // Milliseconds, as the record keeps it.
        let at = Utc
            .timestamp_millis_opt(Utc::now().timestamp_millis())
            .single()
            .expect("now is a valid time");
        let claim = json!({"nonce": nonce, "operator": operator, "reason": reason,
            "at_ms": at.timestamp_millis(), "state": "claimed"});
        send(
            &producer,
            &self.replays,
            id.as_bytes(),
            claim.to_string().as_bytes(),
            None,
        )
        .await?;
        let first = self.records().await?.remove(id);
        match first {
            Some(record) if record.nonce == nonce => {}
            Some(record) => return Err(already(id, record)),
            None => return Err(DeadLetterError::TimedOut(self.replays.clone())),
        }

        let source = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "dlq.origin"))
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|origin| Some(origin.rsplitn(3, '/').nth(2)?.to_owned()))
            .unwrap_or_else(|| self.topic.clone());
        let mut headers = OwnedHeaders::new();
        for header in message.headers().into_iter().flat_map(|h| h.iter()) {
            if !header.key.starts_with(METADATA_PREFIX) {
                headers = headers.insert(Header {
                    key: header.key,
                    value: header.value,
                });
            }
        }
        let (partition, offset) = send(
            &producer,
            &source,
            message.key().unwrap_or_default(),
            message.payload().unwrap_or_default(),
            Some(headers),
        )
        .await?;
        let replay = Replay {
            operator: operator.to_owned(),
            reason: reason.to_owned(),
            at,
            new_id: format!("{partition}/{offset}"),
        };
        let done = json!({"nonce": nonce, "operator": operator, "reason": reason,
            "at_ms": at.timestamp_millis(), "state": "replayed", "new_id": replay.new_id});
        send(
            &producer,
            &self.replays,
            id.as_bytes(),
            done.to_string().as_bytes(),
            None,
        )
        .await?;
        Ok(replay)
    }
}

impl KafkaDeadLetters {
    async fn message(&self, id: &str) -> Result<Option<OwnedMessage>, DeadLetterError> {
        let (partition, offset) = parse_id(id)?;
        let (client, dead) = (self.client.clone(), self.dead.clone());
        let messages =
            blocking(move || read_topic(&client, &dead, Some((partition, offset - 1)), 1)).await?;
        Ok(messages
            .into_iter()
            .find(|m| m.partition() == partition && m.offset() == offset))
    }

    /// Each dead letter's first claim, completed by its record if there is
    /// one.
    async fn records(&self) -> Result<HashMap<String, Record>, DeadLetterError> {
        let (client, replays) = (self.client.clone(), self.replays.clone());
        let messages = blocking(move || read_topic(&client, &replays, None, usize::MAX)).await?;
        let mut records: HashMap<String, Record> = HashMap::new();
        for message in &messages {
            let (Some(key), Some(record)) = (
                message.key().and_then(|k| std::str::from_utf8(k).ok()),
                message.payload().and_then(Record::parse),
            ) else {
                continue;
            };
            match records.get_mut(key) {
                None => {
                    records.insert(key.to_owned(), record);
                }
                Some(first) if first.nonce == record.nonce && record.new_id.is_some() => {
                    first.new_id = record.new_id;
                }
                Some(_) => {}
            }
        }
        Ok(records)
    }

    async fn ensure_record_topic(&self) -> Result<(), DeadLetterError> {
        let admin: AdminClient<DefaultClientContext> = self.client.create()?;
        let results = admin
            .create_topics(
                &[NewTopic::new(&self.replays, 1, TopicReplication::Fixed(-1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(KafkaError::AdminOp(code).into()),
            }
        }
        Ok(())
    }

    fn dead_letter(&self, message: &OwnedMessage, records: &HashMap<String, Record>) -> DeadLetter {
        let mut headers: Vec<(String, String)> = Vec::new();
        let mut metadata: HashMap<&str, String> = HashMap::new();
        for header in message.headers().into_iter().flat_map(|h| h.iter()) {
            let value = String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned();
            if header.key.starts_with(METADATA_PREFIX) {
                metadata.insert(header.key, value);
            } else {
                headers.push((header.key.to_owned(), value));
            }
        }
        headers.sort();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let id = format!("{}/{}", message.partition(), message.offset());
        DeadLetter {
            source: metadata
                .get("dlq.origin")
                .and_then(|o| Some(o.rsplitn(3, '/').nth(2)?.to_owned()))
                .unwrap_or_else(|| self.topic.clone()),
            error: metadata.remove("dlq.error").unwrap_or_default(),
            deliveries: None,
            dead_lettered_at: message
                .timestamp()
                .to_millis()
                .and_then(|ms| Utc.timestamp_millis_opt(ms).single()),
            event_id: header(names::EVENT_ID),
            event_type: header(names::EVENT_TYPE),
            partition_key: message
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .or_else(|| header(names::PARTITION_KEY)),
            payload: message.payload().unwrap_or_default().to_vec(),
            replayed: records.get(&id).map(Record::replay),
            headers,
            id,
        }
    }
}

/// A line of the record topic.
struct Record {
    nonce: String,
    operator: String,
    reason: String,
    at: DateTime<Utc>,
    new_id: Option<String>,
}

impl Record {
    fn parse(bytes: &[u8]) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        Some(Self {
            nonce: value["nonce"].as_str()?.to_owned(),
            operator: value["operator"].as_str()?.to_owned(),
            reason: value["reason"].as_str()?.to_owned(),
            at: Utc
                .timestamp_millis_opt(value["at_ms"].as_i64()?)
                .single()?,
            new_id: value["new_id"].as_str().map(str::to_owned),
        })
    }

    fn replay(&self) -> Replay {
        Replay {
            operator: self.operator.clone(),
            reason: self.reason.clone(),
            at: self.at,
            new_id: self.new_id.clone().unwrap_or_default(),
        }
    }
}

fn already(id: &str, record: Record) -> DeadLetterError {
    ReplayRefused::AlreadyReplayed {
        id: id.to_owned(),
        replay: record.replay(),
    }
    .into()
}

fn parse_id(id: &str) -> Result<(i32, i64), DeadLetterError> {
    let parsed = id
        .split_once('/')
        .and_then(|(p, o)| Some((p.parse().ok()?, o.parse().ok()?)));
    parsed.ok_or_else(|| ReplayRefused::NotFound(format!("{id} (ids are partition/offset)")).into())
}

async fn send(
    producer: &FutureProducer,
    topic: &str,
    key: &[u8],
    payload: &[u8],
    headers: Option<OwnedHeaders>,
) -> Result<(i32, i64), DeadLetterError> {
    let mut record = FutureRecord::to(topic).key(key).payload(payload);
    if let Some(headers) = headers {
        record = record.headers(headers);
    }
    let delivered = producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(|(e, _)| e)?;
    Ok((delivered.partition, delivered.offset))
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, DeadLetterError> + Send + 'static,
) -> Result<T, DeadLetterError> {
    tokio::task::spawn_blocking(work)
        .await
        .expect("a dead-letter read does not panic")
}

/// Reads up to `limit` messages of each partition of `topic` (after
/// `after`'s position in its partition, from partitions at or past it),
/// to the partition's end as of the start; a missing topic has none.
fn read_topic(
    client: &ClientConfig,
    topic: &str,
    after: Option<(i32, i64)>,
    limit: usize,
) -> Result<Vec<OwnedMessage>, DeadLetterError> {
    let consumer: BaseConsumer = client
        .clone()
        .set(
            "group.id",
            format!("outbox-dead-letters-{}", outbox_core::uuid::Uuid::new_v4()),
        )
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(Vec::new());
    };
    if found.error().is_some() {
        return Ok(Vec::new());
    }
    let mut assignment = TopicPartitionList::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for partition in found.partitions().iter().map(|p| p.id()) {
        if after.is_some_and(|(p, _)| partition < p) {
            continue;
        }
        let (low, high) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))?;
        let start = match after {
            Some((p, offset)) if p == partition => (offset + 1).max(low),
            _ => low,
        };
        let end = high.min(start.saturating_add(limit.min(i64::MAX as usize) as i64));
        if start < end {
            assignment.add_partition_offset(topic, partition, Offset::Offset(start))?;
            ends.insert(partition, end);
        }
    }
    let mut messages = Vec::new();
    if ends.is_empty() {
        return Ok(messages);
    }
    consumer.assign(&assignment)?;
    let started = Instant::now();
    while !ends.is_empty() {
        if started.elapsed() > READ_LIMIT {
            return Err(DeadLetterError::TimedOut(topic.to_owned()));
        }
        let Some(polled) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = polled?;
        let partition = message.partition();
        let Some(&end) = ends.get(&partition) else {
            continue;
        };
        if message.offset() < end {
            messages.push(message.detach());
        }
        if message.offset() + 1 >= end {
            ends.remove(&partition);
        }
    }
    messages.sort_by_key(|m| (m.partition(), m.offset()));
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_partition_slash_offset() {
        assert_eq!(parse_id("2/41").unwrap(), (2, 41));
        assert!(parse_id("41").is_err());
        assert!(parse_id("a/b").is_err());
    }

    #[test]
    fn a_record_without_new_id_is_a_claim() {
        let claim = Record::parse(
            br#"{"nonce":"n","operator":"ana","reason":"r","at_ms":7,"state":"claimed"}"#,
        )
        .unwrap();
        assert_eq!(claim.new_id, None);
        assert_eq!(claim.replay().new_id, "");
        assert!(Record::parse(b"not json").is_none());
    }
}
