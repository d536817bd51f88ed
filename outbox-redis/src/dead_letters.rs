//! The dead letters of one stream (`{stream}{suffix}`, where
//! [`RedisConsumer`](crate::RedisConsumer) puts what it gave up on): list,
//! show and replay them.
//!
//! A replay copies the entry's fields (the `dlq.*` metadata left out) back
//! onto the stream, where the consumer group reads it as a new entry, and
//! records who, why, when and the new entry id in the hash
//! `{stream}{suffix}:replays` under the dead entry's id. One Lua script does
//! the check, the copy and the record, so a dead letter is replayed once
//! even when two operators try at the same moment; the dead entry stays
//! for the record. (The three keys must share a hash slot on a cluster:
//! name the stream with a hash tag, `{billing}:invoice.paid`.)

use outbox_core::chrono::{DateTime, TimeZone, Utc};
use outbox_core::dead_letter::{
    DeadLetter, DeadLetterQueue, METADATA_PREFIX, Replay, ReplayRefused,
};
use outbox_core::event::wire::names;
use redis::aio::ConnectionManager;
use redis::streams::{StreamId, StreamRangeReply};
use redis::{AsyncCommands, Value};

/// Why reading or replaying dead letters failed.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// The replay was refused; nothing was written.
    #[error(transparent)]
    Refused(#[from] ReplayRefused),
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// The dead letters of one stream.
#[derive(Clone)]
pub struct RedisDeadLetters {
    connection: ConnectionManager,
    stream: String,
    dead: String,
    replays: String,
}

const REPLAY: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local done = redis.call('HGET', KEYS[3], ARGV[1])
if done then return {'replayed', done} end
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #entries == 0 then return {'missing', ''} end
local fields = entries[1][2]
local copy = {}
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, string.len(ARGV[4])) ~= ARGV[4] then
    table.insert(copy, fields[i])
    table.insert(copy, fields[i + 1])
  end
end
local new_id = redis.call('XADD', KEYS[2], '*', unpack(copy))
local now = redis.call('TIME')
local at_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local record = cjson.encode({new_id = new_id, operator = ARGV[2], reason = ARGV[3], at_ms = at_ms})
redis.call('HSET', KEYS[3], ARGV[1], record)
return {'ok', record}
"#;

impl RedisDeadLetters {
    /// The dead letters of `stream`, kept in `{stream}{suffix}` (the
    /// consumer's [`dead_letter_suffix`](crate::ConsumerConfig), `:dead` by
    /// default).
    pub fn new(connection: ConnectionManager, stream: &str, suffix: &str) -> Self {
        let dead = format!("{stream}{suffix}");
        Self {
            connection,
            stream: stream.to_owned(),
            replays: format!("{dead}:replays"),
            dead,
        }
    }

    /// The key holding the dead letters.
    pub fn dead_letter_stream(&self) -> &str {
        &self.dead
    }
}

#[async_trait::async_trait]
impl DeadLetterQueue for RedisDeadLetters {
    type Error = DeadLetterError;

    fn location(&self) -> String {
        self.dead.clone()
    }

    /// Up to `limit` dead letters, oldest first, after the entry `after`
    /// (exclusive) when given.
    async fn list(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let mut redis = self.connection.clone();
        let start = after.map_or_else(|| "-".to_owned(), |id| format!("({id}"));
        let reply: StreamRangeReply = redis.xrange_count(&self.dead, start, "+", limit).await?;
        let ids: Vec<&str> = reply.ids.iter().map(|e| e.id.as_str()).collect();
        let records: Vec<Option<String>> = if ids.is_empty() {
            Vec::new()
        } else {
            redis::cmd("HMGET")
                .arg(&self.replays)
                .arg(&ids)
                .query_async(&mut redis)
                .await?
        };
        Ok(reply
            .ids
            .iter()
            .zip(records)
            .map(|(entry, record)| self.dead_letter(entry, record.as_deref()))
            .collect())
    }

    /// The dead letter `id`, if there is one.
    async fn get(&self, id: &str) -> Result<Option<DeadLetter>, DeadLetterError> {
        let mut redis = self.connection.clone();
        let reply: StreamRangeReply = redis.xrange(&self.dead, id, id).await?;
        let Some(entry) = reply.ids.first() else {
            return Ok(None);
        };
        let record: Option<String> = redis.hget(&self.replays, id).await?;
        Ok(Some(self.dead_letter(entry, record.as_deref())))
    }

    /// Puts the dead letter `id` back on the stream, once, recording
    /// `operator` and `reason`.
    async fn replay_attributed(
        &self,
        id: &str,
        operator: &str,
        reason: &str,
    ) -> Result<Replay, DeadLetterError> {
        let mut redis = self.connection.clone();
        let (outcome, record): (String, String) = redis::Script::new(REPLAY)
            .key(&self.dead)
            .key(&self.stream)
            .key(&self.replays)
            .arg(id)
            .arg(operator)
            .arg(reason)
            .arg(METADATA_PREFIX)
            .invoke_async(&mut redis)
            .await?;
        match outcome.as_str() {
            "ok" => Ok(parse_record(&record).expect("the script's own record")),
            "replayed" => Err(ReplayRefused::AlreadyReplayed {
                id: id.to_owned(),
                replay: parse_record(&record).unwrap_or_else(|| unreadable_record(&record)),
            }
            .into()),
            _ => Err(ReplayRefused::NotFound(id.to_owned()).into()),
        }
    }
}

impl RedisDeadLetters {
    fn dead_letter(&self, entry: &StreamId, record: Option<&str>) -> DeadLetter {
        let text = |name: &str| match entry.map.get(name) {
            Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Some(Value::SimpleString(s)) => Some(s.clone()),
            _ => None,
        };
        let mut headers: Vec<(String, String)> = entry
            .map
            .keys()
            .filter(|name| !name.starts_with(METADATA_PREFIX) && *name != names::PAYLOAD)
            .filter_map(|name| Some((name.clone(), text(name)?)))
            .collect();
        headers.sort();
        let payload = match entry.map.get(names::PAYLOAD) {
            Some(Value::BulkString(b)) => b.clone(),
            _ => Vec::new(),
        };
        DeadLetter {
            id: entry.id.clone(),
            source: text("dlq.stream").unwrap_or_else(|| self.stream.clone()),
            error: text("dlq.error").unwrap_or_default(),
            deliveries: text("dlq.deliveries").and_then(|d| d.parse().ok()),
            dead_lettered_at: entry_time(&entry.id),
            event_id: text(names::EVENT_ID),
            event_type: text(names::EVENT_TYPE),
            partition_key: text(names::PARTITION_KEY),
            headers,
            payload,
            replayed: record.map(|r| parse_record(r).unwrap_or_else(|| unreadable_record(r))),
        }
    }
}

/// An entry id's time: its first part is milliseconds since the epoch.
fn entry_time(id: &str) -> Option<DateTime<Utc>> {
    let ms: i64 = id.split('-').next()?.parse().ok()?;
    Utc.timestamp_millis_opt(ms).single()
}

fn parse_record(record: &str) -> Option<Replay> {
    let value: serde_json::Value = outbox_core::serde_json::from_str(record).ok()?;
    Some(Replay {
        operator: value["operator"].as_str()?.to_owned(),
        reason: value["reason"].as_str()?.to_owned(),
        at: Utc
            .timestamp_millis_opt(value["at_ms"].as_i64()?)
            .single()?,
        new_id: value["new_id"].as_str()?.to_owned(),
    })
}

/// A record another tool wrote: still a replay, shown as it is.
fn unreadable_record(record: &str) -> Replay {
    Replay {
        operator: String::new(),
        reason: record.to_owned(),
        at: DateTime::<Utc>::UNIX_EPOCH,
        new_id: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_ids_first_part_is_its_time() {
        let at = entry_time("1700000000123-4").unwrap();
        assert_eq!(at.timestamp_millis(), 1_700_000_000_123);
        assert_eq!(entry_time("not-an-id"), None);
    }

    #[test]
    fn a_record_reads_back() {
        let replay =
            parse_record(r#"{"new_id":"1-0","operator":"ana","reason":"fixed","at_ms":5}"#)
                .unwrap();
        assert_eq!(replay.operator, "ana");
        assert_eq!(replay.new_id, "1-0");
        assert_eq!(replay.at.timestamp_millis(), 5);
        assert!(parse_record("{}").is_none());
    }
}
