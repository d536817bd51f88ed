//! [`RedisPublisher`]: one append script per batch (see [`crate::append`]),
//! one classified outcome per event.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use outbox_core::ErrorClass;
use outbox_core::{PublishError, PublishOutcome, Publisher, PublisherCapabilities, StoredEvent};
use redis::Script;
use redis::aio::ConnectionManager;

use crate::append::{self, Appended, Entry};
use crate::config::{StreamRouter, Trim};
use crate::connection::{ConnectionSettings, LazyConnection};
use crate::error::{classify, classify_code};
use crate::fields::entry_fields;

/// Publishes to Redis Streams. The stream is chosen by a [`StreamRouter`]
/// over the event type; fields carry the event (see [`crate::fields`]).
///
/// A batch goes out as one server-side script (not a pipeline or `MULTI`:
/// each entry gets its own outcome, and an entry that fails holds back the
/// later entries of its key). So the relay hands over a whole batch, a key's
/// run of events included, in one round trip, and per-key order holds: a
/// stream appends in the order given and nothing of a key passes its
/// failure.
#[derive(Clone)]
pub struct RedisPublisher {
    connection: LazyConnection,
    router: StreamRouter,
    trims: HashMap<String, Trim>,
    max_batch: usize,
    script: Script,
}

impl std::fmt::Debug for RedisPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPublisher")
            .field("router", &self.router)
            .finish_non_exhaustive()
    }
}

impl RedisPublisher {
    /// A publisher on `connection` (reconnects by itself) routing with `router`.
    pub fn new(connection: ConnectionManager, router: StreamRouter) -> Self {
        Self::on(LazyConnection::ready(connection), router)
    }

    /// A publisher for the server at `url`, built without connecting (a
    /// relay can start while Redis is down: every publish is an outage until
    /// a connection succeeds), with the default connect and response
    /// timeouts ([`ConnectionSettings`]). A malformed URL fails here.
    pub fn from_url(url: &str, router: StreamRouter) -> Result<Self, redis::RedisError> {
        Self::from_url_with(url, router, ConnectionSettings::default())
    }

    /// [`Self::from_url`] with explicit connection settings.
    pub fn from_url_with(
        url: &str,
        router: StreamRouter,
        settings: ConnectionSettings,
    ) -> Result<Self, redis::RedisError> {
        Ok(Self::on(LazyConnection::open(url, settings)?, router))
    }

    fn on(connection: LazyConnection, router: StreamRouter) -> Self {
        Self {
            connection,
            router,
            trims: HashMap::new(),
            max_batch: 512,
            script: append::script(),
        }
    }

    /// Trims `stream` approximately on every append.
    pub fn with_trim(mut self, stream: impl Into<String>, trim: Trim) -> Self {
        self.trims.insert(stream.into(), trim);
        self
    }

    /// The stream `event_type` goes to.
    pub fn stream_for(&self, event_type: &str) -> String {
        self.router.stream_for(event_type)
    }

    fn entry(&self, event: &StoredEvent) -> Entry {
        Entry {
            stream: self.router.stream_for(&event.event_type),
            partition_key: event.partition_key.clone(),
            fields: entry_fields(event),
        }
    }

    /// `MAXLEN`/`MINID` and its value for `stream`'s approximate trim.
    fn trim_args(&self, stream: &str) -> Option<(&'static str, String)> {
        match self.trims.get(stream)? {
            Trim::MaxLen(n) => Some(("MAXLEN", n.to_string())),
            Trim::MaxAge(age) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                Some(("MINID", now.saturating_sub(*age).as_millis().to_string()))
            }
        }
    }
}

#[async_trait]
impl Publisher for RedisPublisher {
    fn capabilities(&self) -> PublisherCapabilities {
        PublisherCapabilities {
            max_batch: self.max_batch,
            // The append script stops a key at its first failed XADD.
            preserves_key_order: true,
        }
    }

    /// `redis <host:port> streams <prefix>…` (the address when built from
    /// a URL).
    fn destination(&self) -> String {
        let address = self
            .connection
            .address()
            .unwrap_or_else(|| "(connection)".into());
        format!("redis {address} streams {}", self.router.describe())
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        if batch.is_empty() {
            return Vec::new();
        }
        // The manager's timeouts bound each step, not the call: a
        // reconnection and the script loaded again after a restart add up.
        // Past the limit the server is not answering, which is its state,
        // not an event's (the script is atomic: it ran whole or not at all).
        let limit = self.connection.call_limit();
        match tokio::time::timeout(limit, self.append(batch)).await {
            Ok(outcomes) => outcomes,
            Err(_) => every(
                batch,
                ErrorClass::Outage,
                format!("no answer from Redis within {limit:?}"),
            ),
        }
    }
}

impl RedisPublisher {
    /// One append script for `batch`, one outcome per event.
    async fn append(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let mut connection = match self.connection.get().await {
            Ok(connection) => connection,
            // No connection at all (refused, timed out, a bad database
            // index or password): nothing this batch did; the destination
            // is unusable until someone or something fixes it.
            Err(e) => {
                return every(
                    batch,
                    ErrorClass::Outage,
                    format!("cannot connect to Redis: {e}"),
                );
            }
        };
        let entries: Vec<Entry> = batch.iter().map(|event| self.entry(event)).collect();
        let invocation =
            append::invocation(&self.script, &entries, |stream| self.trim_args(stream));
        match invocation
            .invoke_async::<Vec<String>>(&mut connection)
            .await
        {
            Ok(replies) if replies.len() == batch.len() => replies
                .iter()
                .map(|reply| match Appended::parse(reply) {
                    Appended::Ok => Ok(()),
                    Appended::Held => Err(PublishError::new(
                        ErrorClass::Transient,
                        "not sent: an earlier event of its key failed in this call",
                    )),
                    Appended::Failed(e) => Err(PublishError::new(
                        classify_code(e.split_whitespace().next().unwrap_or("")),
                        format!("XADD: {e}"),
                    )),
                })
                .collect(),
            Ok(replies) => every(
                batch,
                ErrorClass::Transient,
                format!("{} replies for {} XADDs", replies.len(), batch.len()),
            ),
            Err(e) => every(batch, classify(&e), format!("XADD script: {e}")),
        }
    }
}

/// The same failure for every event of `batch`.
fn every(batch: &[&StoredEvent], class: ErrorClass, message: String) -> Vec<PublishOutcome> {
    batch
        .iter()
        .map(|_| Err(PublishError::new(class, message.clone())))
        .collect()
}
