//! Where events go, and how the producer is configured.

use std::time::Duration;

outbox_core::prefix_router!(
    /// Chooses the topic for an event type: `{prefix}{event_type}` unless an
    /// override names another topic.
    TopicRouter,
    "topic",
    topic_for,
    default ""
);

/// Producer settings. The defaults make the producer idempotent (no
/// duplicates from its own retries, order kept with several requests in
/// flight) and gap-less, and bound every publish call by
/// `delivery_timeout`.
#[derive(Clone, Debug)]
pub struct KafkaPublisherConfig {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// The longest a publish call waits for its delivery reports; then
    /// what is still queued or in flight is purged and reported as not
    /// delivered. Keep it shorter than the relay's publish timeout (and so
    /// its lease). Default 4 s.
    pub delivery_timeout: Duration,
    /// Any librdkafka setting, applied last (TLS, SASL, compression, …).
    /// Setting `message.timeout.ms` or turning off idempotence or
    /// `enable.gapless.guarantee` voids the per-key order the publisher
    /// promises within a call.
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
            // A failed batch stops the producer (a fatal error: it is
            // replaced) instead of letting the next batch of its partition
            // through, so a partition's failures are a suffix of its
            // messages and a key's later events never overtake a failed one.
            .set("enable.gapless.guarantee", "true")
            .set("linger.ms", "5")
            // No local timeout: one is outside the gap-less guarantee (a
            // message timed out in the queue, a later one of its partition
            // delivered). Each call bounds its wait and purges instead.
            .set("message.timeout.ms", "0")
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
        reconnect_promptly(&mut config);
        for (key, value) in &self.librdkafka {
            config.set(key, value);
        }
        config
    }
}

/// Reconnect backoff of 100 ms doubling to at most 1 s (librdkafka's own
/// maximum is 10 s). Connections refused during a short cut grow the backoff
/// fast, and with 10 s a consumer may not reach its group coordinator again
/// until after its session timed out (its partitions revoked, their
/// messages redelivered), nor a relay its broker until seconds after the
/// outage ended. A reconnect attempt a second per broker during a long
/// outage costs nothing. Overridable through the `librdkafka` settings.
pub(crate) fn reconnect_promptly(config: &mut rdkafka::ClientConfig) {
    config
        .set("reconnect.backoff.ms", "100")
        .set("reconnect.backoff.max.ms", "1000");
}

/// Checks a `bootstrap.servers` list: comma-separated `host[:port]`
/// entries (a `scheme://` prefix and `[ipv6]` hosts allowed, as librdkafka
/// takes them), no spaces, ports 1 to 65535. librdkafka accepts any text
/// and retries a bad address forever, logging; refused here, the mistake
/// is seen when the client is built.
pub(crate) fn check_bootstrap_servers(list: &str) -> Result<(), String> {
    if list.trim().is_empty() {
        return Err("bootstrap_servers must not be empty".into());
    }
    for entry in list.split(',') {
        let bad = |why: &str| Err(format!("bootstrap server `{entry}`: {why}"));
        let address = entry.rsplit_once("://").map_or(entry, |(_, rest)| rest);
        if address.is_empty() || address.chars().any(char::is_whitespace) {
            return bad("expected host:port without spaces");
        }
        let port = match address.strip_prefix('[') {
            Some(bracketed) => match bracketed.split_once(']') {
                Some((host, rest)) if !host.is_empty() => rest.strip_prefix(':'),
                _ => return bad("an IPv6 host must be written [addr]:port"),
            },
            None => match address.split_once(':') {
                Some(("", _)) => return bad("the host is empty"),
                Some((_, port)) => Some(port),
                None => None,
            },
        };
        if let Some(port) = port {
            match port.parse::<u16>() {
                Ok(p) if p > 0 => {}
                _ => return bad("the port must be a number from 1 to 65535"),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_bootstrap_servers;

    #[test]
    fn bootstrap_lists_are_checked() {
        for good in [
            "127.0.0.1:19092",
            "broker-1:9092,broker-2:9092",
            "broker",
            "SSL://broker:9093",
            "[::1]:9092",
        ] {
            assert!(check_bootstrap_servers(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "127.0.0.1:notaport",
            "broker:0",
            "broker:70000",
            "broker one:9092",
            "a:1,,b:2",
            ":9092",
            "[::1:9092",
        ] {
            assert!(check_bootstrap_servers(bad).is_err(), "{bad:?}");
        }
    }
}
