//! [`RedisPublisher`]: one pipeline of `XADD`s per batch, one classified
//! outcome per event.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use outbox_core::{PublishError, PublishOutcome, Publisher, PublisherCapabilities, StoredEvent};
use redis::Value;
use redis::aio::{ConnectionLike, ConnectionManager};

use crate::config::{StreamRouter, Trim};
use crate::connection::{ConnectionSettings, LazyConnection};
use crate::error::classify;
use crate::fields::entry_fields;

/// Publishes to Redis Streams. The stream is chosen by a [`StreamRouter`]
/// over the event type; fields carry the event (see [`crate::fields`]).
///
/// A batch goes out as one pipeline (not `MULTI`: each entry gets its own
/// outcome). Per-key order holds because the relay hands a key's events to
/// one publisher in order and a stream appends in arrival order.
#[derive(Clone)]
pub struct RedisPublisher {
    connection: LazyConnection,
    router: StreamRouter,
    trims: HashMap<String, Trim>,
    max_batch: usize,
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

    fn xadd(&self, event: &StoredEvent) -> redis::Cmd {
        let stream = self.router.stream_for(&event.event_type);
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&stream);
        match self.trims.get(&stream) {
            Some(Trim::MaxLen(n)) => {
                cmd.arg("MAXLEN").arg("~").arg(*n);
            }
            Some(Trim::MaxAge(age)) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                let min_id = now.saturating_sub(*age).as_millis();
                cmd.arg("MINID").arg("~").arg(min_id.to_string());
            }
            None => {}
        }
        cmd.arg("*");
        for (name, value) in entry_fields(event) {
            cmd.arg(name).arg(value);
        }
        cmd
    }
}

#[async_trait]
impl Publisher for RedisPublisher {
    fn capabilities(&self) -> PublisherCapabilities {
        PublisherCapabilities {
            max_batch: self.max_batch,
            // A failed XADD does not stop later ones in the same pipeline.
            preserves_key_order: false,
        }
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        if batch.is_empty() {
            return Vec::new();
        }
        let mut pipe = redis::pipe();
        for event in batch {
            pipe.add_command(self.xadd(event));
        }
        let mut connection = match self.connection.get().await {
            Ok(connection) => connection,
            // No connection at all (refused, timed out, a bad database
            // index or password): nothing this batch did; the destination
            // is unusable until someone or something fixes it.
            Err(e) => {
                return batch
                    .iter()
                    .map(|_| {
                        Err(PublishError::new(
                            outbox_core::ErrorClass::Outage,
                            format!("cannot connect to Redis: {e}"),
                        ))
                    })
                    .collect();
            }
        };
        match connection.req_packed_commands(&pipe, 0, batch.len()).await {
            Ok(replies) if replies.len() == batch.len() => replies
                .into_iter()
                .map(|reply| match reply {
                    Value::ServerError(e) => {
                        let e = redis::RedisError::from(e);
                        Err(PublishError::new(classify(&e), format!("XADD: {e}")))
                    }
                    _ => Ok(()),
                })
                .collect(),
            Ok(replies) => batch
                .iter()
                .map(|_| {
                    Err(PublishError::new(
                        outbox_core::ErrorClass::Transient,
                        format!("{} replies for {} XADDs", replies.len(), batch.len()),
                    ))
                })
                .collect(),
            Err(e) => {
                let class = classify(&e);
                batch
                    .iter()
                    .map(|_| Err(PublishError::new(class, format!("XADD pipeline: {e}"))))
                    .collect()
            }
        }
    }
}
