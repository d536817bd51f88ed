//! Where events go, and how the producer is configured.

use std::collections::HashMap;
use std::time::Duration;

/// Chooses the topic for an event type: `{prefix}{event_type}` unless an
/// override names another topic.
#[derive(Clone, Debug)]
pub struct TopicRouter {
    prefix: String,
    overrides: HashMap<String, String>,
}

impl TopicRouter {
    /// Topics named `{prefix}{event_type}`.
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            overrides: HashMap::new(),
        }
    }

    /// Sends `event_type` to `topic` instead.
    pub fn route(mut self, event_type: impl Into<String>, topic: impl Into<String>) -> Self {
        self.overrides.insert(event_type.into(), topic.into());
        self
    }

    /// The topic for `event_type`.
    pub fn topic_for(&self, event_type: &str) -> String {
        self.overrides
            .get(event_type)
            .cloned()
            .unwrap_or_else(|| format!("{}{event_type}", self.prefix))
    }
}

impl Default for TopicRouter {
    fn default() -> Self {
        Self::with_prefix("")
    }
}

/// Producer settings. The defaults make the producer idempotent (no
/// duplicates from its own retries, order kept with several requests in
/// flight) and bound every delivery by `delivery_timeout`.
#[derive(Clone, Debug)]
pub struct KafkaPublisherConfig {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// `message.timeout.ms`, and the longest a publish call waits for its
    /// delivery reports. Keep it shorter than the relay's publish timeout
    /// (and so its lease). Default 4 s.
    pub delivery_timeout: Duration,
    /// Any librdkafka setting, applied last (TLS, SASL, compression, …).
    pub librdkafka: Vec<(String, String)>,
}

impl KafkaPublisherConfig {
    /// Defaults against `bootstrap_servers`.
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        Self {
            bootstrap_servers: bootstrap_servers.into(),
            delivery_timeout: Duration::from_secs(4),
            librdkafka: Vec::new(),
        }
    }

    /// Adds a librdkafka setting (e.g. `security.protocol`, `sasl.mechanism`).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.librdkafka.push((key.into(), value.into()));
        self
    }

    pub(crate) fn client_config(&self) -> rdkafka::ClientConfig {
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("max.in.flight.requests.per.connection", "5")
            .set("linger.ms", "5")
            .set(
                "message.timeout.ms",
                self.delivery_timeout.as_millis().to_string(),
            )
            // A request in flight when the connection drops is otherwise
            // awaited for 30 s, past the delivery timeout.
            .set(
                "request.timeout.ms",
                self.delivery_timeout.as_millis().max(1000).to_string(),
            )
            // A topic missing from the metadata fails as UnknownTopic (a
            // configuration outage) well before the delivery times out, not
            // as an anonymous timeout counted against each event.
            .set(
                "topic.metadata.propagation.max.ms",
                (self.delivery_timeout.as_millis() / 2).max(500).to_string(),
            );
        for (key, value) in &self.librdkafka {
            config.set(key, value);
        }
        config
    }
}
