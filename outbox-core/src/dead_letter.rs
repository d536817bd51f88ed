//! Consumer-side dead letters as one model, whatever the broker: what a
//! consumer runner gave up on (a Redis `<stream>:dead` entry, a Kafka
//! dead-letter topic's message, an SQS dead-letter queue's message), and
//! the record of an operator's replay. Each broker adapter reads and
//! replays its own (`outbox_redis::dead_letters`, …); the CLI's
//! `outbox dead-letters` prints this model.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// One dead letter, as its dead-letter destination holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// The broker's id of the dead letter (a Redis entry id, a Kafka
    /// `partition/offset`, an SQS message id): what `show` and `replay`
    /// take.
    pub id: String,
    /// Where its consumer read it (stream, topic, queue URL), and where a
    /// replay puts it back.
    pub source: String,
    /// Why the consumer gave up.
    pub error: String,
    /// Deliveries (receives) before it gave up, where the broker counts.
    pub deliveries: Option<u64>,
    /// When it was dead-lettered (the broker's time), where known.
    pub dead_lettered_at: Option<DateTime<Utc>>,
    /// The outbox event id, when the message is an outbox event.
    pub event_id: Option<String>,
    /// The event type, when the message is an outbox event.
    pub event_type: Option<String>,
    /// The ordering key, when the message is an outbox event.
    pub partition_key: Option<String>,
    /// The original message's fields or headers (the dead-letter metadata
    /// left out), sorted by name.
    pub headers: Vec<(String, String)>,
    /// The message body (may hold personal data: printed only on request).
    #[serde(skip)]
    pub payload: Vec<u8>,
    /// Set once an operator replayed it: a dead letter is replayed once.
    pub replayed: Option<Replay>,
}

/// An operator's replay of a dead letter: who, why, when, and the id the
/// message got where its consumer reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Replay {
    /// Who replayed it.
    pub operator: String,
    /// Why.
    pub reason: String,
    /// When (the broker's clock where it has one, else the operator's).
    pub at: DateTime<Utc>,
    /// The replayed message's id in the source (entry id, partition/offset,
    /// message id).
    pub new_id: String,
}

/// Why a replay did not happen. Nothing was written in either case.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayRefused {
    /// No dead letter has this id.
    #[error("no dead letter {0}")]
    NotFound(String),
    /// It was replayed before: replaying again would deliver it twice.
    #[error("dead letter {id} was already replayed by {} at {} ({}) as {}", .replay.operator, .replay.at, .replay.reason, .replay.new_id)]
    AlreadyReplayed {
        /// The dead letter.
        id: String,
        /// The earlier replay.
        replay: Replay,
    },
    /// Operator or reason is empty: both are kept in the record.
    #[error("a replay needs an operator and a reason (they are kept in its record)")]
    Unattributed,
}

/// Checks the operator and reason a replay records.
pub fn check_attribution(operator: &str, reason: &str) -> Result<(), ReplayRefused> {
    if operator.trim().is_empty() || reason.trim().is_empty() {
        return Err(ReplayRefused::Unattributed);
    }
    Ok(())
}

/// Metadata names the adapters add to a dead letter (`dlq.error`, …):
/// left out of [`DeadLetter::headers`] and of a replayed message.
pub const METADATA_PREFIX: &str = "dlq.";

/// A broker's dead letters of one source, read and replayed alike on
/// every broker: the Redis, Kafka and SQS adapters implement it, and the
/// CLI's `outbox dead-letters` drives each through it.
#[async_trait::async_trait]
pub trait DeadLetterQueue: Send + Sync {
    /// The broker's error; a refused replay is one of its values.
    type Error: std::error::Error + From<ReplayRefused> + Send + Sync + 'static;

    /// Where the dead letters are (a stream, a topic, a queue), for
    /// operators' messages.
    fn location(&self) -> String;

    /// Up to `limit` dead letters in the broker's order, after the dead
    /// letter `after` (exclusive) when given. A broker without an order to
    /// page by (SQS) refuses `after`.
    async fn list(&self, after: Option<&str>, limit: usize)
    -> Result<Vec<DeadLetter>, Self::Error>;

    /// The dead letter `id`, if there is one.
    async fn get(&self, id: &str) -> Result<Option<DeadLetter>, Self::Error>;

    /// [`replay`](Self::replay) once its attribution is checked: puts the
    /// dead letter back where its consumer reads, once, and records who
    /// did it and why.
    async fn replay_attributed(
        &self,
        id: &str,
        operator: &str,
        reason: &str,
    ) -> Result<Replay, Self::Error>;

    /// Puts the dead letter `id` back where its consumer reads, once,
    /// recording `operator` and `reason` (both required).
    async fn replay(&self, id: &str, operator: &str, reason: &str) -> Result<Replay, Self::Error> {
        check_attribution(operator, reason)?;
        self.replay_attributed(id, operator, reason).await
    }
}
