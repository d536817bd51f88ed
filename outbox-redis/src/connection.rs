//! [`LazyConnection`]: a Redis connection built from a URL without touching
//! the network, connected on first use (and again after a failed attempt),
//! with connect and response timeouts by default. A relay can then start
//! while Redis is down: its publisher reports an outage until Redis is back.

use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// How a [`LazyConnection`] connects. Defaults: connect timeout 2 s,
/// response timeout 5 s (longer than a consumer's blocking read), 2 quick
/// retries per reconnect (200 ms apart: they bridge a blip; a longer outage
/// is the relay's or the consumer's to wait out, with their own backoff).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// How long a command may wait for its reply.
    pub response_timeout: Duration,
    /// Reconnection attempts after a connection drops, before a command fails.
    pub retries: usize,
}

/// The pause between the connection manager's reconnect attempts.
const RECONNECT_DELAY_MS: u64 = 200;

impl Default for ConnectionSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            retries: 2,
        }
    }
}

impl ConnectionSettings {
    /// The connection manager's configuration for these settings. Build
    /// your own `ConnectionManager` with it (a [`crate::RedisInbox`], a
    /// shared connection): the redis crate's defaults wait minutes between
    /// reconnect attempts.
    pub fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(self.connect_timeout)
            .set_response_timeout(self.response_timeout)
            .set_number_of_retries(self.retries)
            // redis 0.32 hands `factor` to backon, whose delays start at 1 s
            // and are multiplied by it: the default (100, meant as
            // milliseconds) makes the second retry wait backon's 60 s cap,
            // and every command waits on the reconnection in progress, so a
            // dropped connection hung each publish for 1 to 2 minutes.
            .set_factor(2)
            .set_max_delay(RECONNECT_DELAY_MS)
    }
}

/// A connection manager made on first use. Clones share it.
#[derive(Clone)]
pub struct LazyConnection {
    client: Option<redis::Client>,
    settings: ConnectionSettings,
    connected: Arc<tokio::sync::Mutex<Option<ConnectionManager>>>,
}

impl std::fmt::Debug for LazyConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyConnection")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl LazyConnection {
    /// Parses `url` (a malformed one fails here); connects later.
    pub fn open(url: &str, settings: ConnectionSettings) -> Result<Self, RedisError> {
        Ok(Self {
            client: Some(redis::Client::open(url)?),
            settings,
            connected: Arc::default(),
        })
    }

    /// Wraps a connection made elsewhere.
    pub fn ready(connection: ConnectionManager) -> Self {
        Self {
            client: None,
            settings: ConnectionSettings::default(),
            connected: Arc::new(tokio::sync::Mutex::new(Some(connection))),
        }
    }

    /// The server's address (`host:port` or a socket path), when this was
    /// built from a URL: no credentials.
    pub fn address(&self) -> Option<String> {
        self.client
            .as_ref()
            .map(|client| client.get_connection_info().addr.to_string())
    }

    /// The longest one call may wait on Redis as a whole: connecting (when
    /// there is no connection yet) and one reply. A publisher bounds each
    /// batch by it, so its answer is an outage from Redis rather than the
    /// relay's publish timeout (which burns an attempt per key).
    pub fn call_limit(&self) -> Duration {
        self.settings.connect_timeout + self.settings.response_timeout
    }

    /// The connection, connecting now if there is none yet (bounded by the
    /// connect timeout).
    pub async fn get(&self) -> Result<ConnectionManager, RedisError> {
        let mut connected = self.connected.lock().await;
        if let Some(connection) = connected.as_ref() {
            return Ok(connection.clone());
        }
        let client = self
            .client
            .clone()
            .expect("a lazy connection without a connection has a client");
        // One plain attempt first: refused, a bad database index or a wrong
        // password fail here at once, where the manager would retry with
        // backoff before saying so.
        let probe = client.get_multiplexed_async_connection();
        match tokio::time::timeout(self.settings.connect_timeout, probe).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Err(error),
            Err(_) => {
                return Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no Redis connection within {:?}",
                        self.settings.connect_timeout
                    ),
                )));
            }
        }
        let connect = ConnectionManager::new_with_config(client, self.settings.manager_config());
        // The manager's own timeout bounds each attempt; this bounds the
        // whole (a server that accepts and never answers the handshake).
        let limit = self.settings.connect_timeout + self.settings.response_timeout;
        let connection = match tokio::time::timeout(limit, connect).await {
            Ok(connection) => connection?,
            Err(_) => {
                return Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no Redis connection within {limit:?}"),
                )));
            }
        };
        *connected = Some(connection.clone());
        Ok(connection)
    }
}
