//! The relay daemon's settings: a TOML file, the store URL from `--url` /
//! `OUTBOX_URL` when the file has none. Unknown keys are refused, so a typo
//! is an error, not a default.

use std::time::Duration;

use outbox_core::{Ordering, PoisonPolicy, RelayConfig, RetryPolicy};
use serde::Deserialize;

use crate::error::CliError;

/// The file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// The store URL (else `--url` / `OUTBOX_URL`).
    pub url: Option<String>,
    /// PostgreSQL schema or MySQL database of the tables.
    pub schema: Option<String>,
    /// Table name prefix.
    pub prefix: Option<String>,
    /// Relay settings; every one has the library's default.
    #[serde(default)]
    pub relay: RelaySection,
    /// Where events go.
    pub broker: BrokerSection,
    /// `/metrics` and `/health`.
    pub http: Option<HttpSection>,
    /// Scheduled purge of published events.
    pub purge: Option<PurgeSection>,
}

/// `[relay]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySection {
    /// Relay id (lease owner, history actor).
    pub id: Option<String>,
    /// Most events claimed at once.
    pub batch_size: Option<usize>,
    /// Lease length (`30s`).
    pub lease: Option<String>,
    /// Bound on one publish call.
    pub publish_timeout: Option<String>,
    /// Backstop poll while idle.
    pub poll_interval: Option<String>,
    /// `per_key` (default) or `unordered`.
    pub ordering: Option<String>,
    /// `skip` (default) or `block`.
    pub poison: Option<String>,
    /// Publish attempts before an event fails.
    pub max_attempts: Option<u32>,
    /// How long shutdown lets the batch in flight finish.
    pub drain_timeout: Option<String>,
}

/// `[broker]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "lowercase")]
pub enum BrokerSection {
    /// Redis Streams: `url`, streams named `{stream_prefix}{event_type}`.
    Redis {
        /// `redis://…`
        url: String,
        /// Default `outbox:`.
        stream_prefix: Option<String>,
    },
    /// Kafka: `bootstrap`, topics named `{topic_prefix}{event_type}`.
    Kafka {
        /// `host:port,…`
        bootstrap: String,
        /// Default empty.
        topic_prefix: Option<String>,
    },
}

/// `[http]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// `127.0.0.1:9464`.
    pub listen: String,
}

/// `[purge]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeSection {
    /// Published events older than this are deleted (`7d`).
    pub published_older_than: String,
    /// How often (`1h`).
    pub every: String,
}

fn duration(name: &str, text: &Option<String>) -> Result<Option<Duration>, CliError> {
    text.as_deref()
        .map(|t| crate::duration::parse(t).map_err(|e| CliError::usage(format!("{name}: {e}"))))
        .transpose()
}

impl DaemonConfig {
    /// Reads and checks `path`.
    pub fn load(path: &std::path::Path) -> Result<Self, CliError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| CliError::usage(format!("{}: {e}", path.display())))
    }

    /// The relay's settings: the library's defaults with the file's values.
    pub fn relay_config(&self) -> Result<RelayConfig, CliError> {
        let r = &self.relay;
        let mut config = RelayConfig::default();
        if let Some(id) = &r.id {
            config.relay_id = outbox_core::store::RelayId::new(id.clone());
        }
        if let Some(n) = r.batch_size {
            config.batch_size = n;
        }
        if let Some(d) = duration("relay.lease", &r.lease)? {
            config.lease_duration = d;
        }
        if let Some(d) = duration("relay.publish_timeout", &r.publish_timeout)? {
            config.publish_timeout = d;
        }
        if let Some(d) = duration("relay.poll_interval", &r.poll_interval)? {
            config.poll_interval = d;
        }
        if let Some(d) = duration("relay.drain_timeout", &r.drain_timeout)? {
            config.drain_timeout = d;
        }
        config.ordering = match r.ordering.as_deref() {
            None | Some("per_key") => Ordering::PerKey,
            Some("unordered") => Ordering::Unordered,
            Some(other) => {
                return Err(CliError::usage(format!(
                    "relay.ordering: {other:?} (per_key or unordered)"
                )));
            }
        };
        config.poison = match r.poison.as_deref() {
            None | Some("skip") => PoisonPolicy::Skip,
            Some("block") => PoisonPolicy::Block,
            Some(other) => {
                return Err(CliError::usage(format!(
                    "relay.poison: {other:?} (skip or block)"
                )));
            }
        };
        if let Some(n) = r.max_attempts {
            config.retry = RetryPolicy {
                max_attempts: n,
                ..config.retry
            };
        }
        config
            .validate()
            .map_err(|e| CliError::usage(format!("relay: {}", e.0)))?;
        Ok(config)
    }

    /// The purge schedule: (older than, every).
    pub fn purge_schedule(&self) -> Result<Option<(Duration, Duration)>, CliError> {
        let Some(p) = &self.purge else {
            return Ok(None);
        };
        let older = duration(
            "purge.published_older_than",
            &Some(p.published_older_than.clone()),
        )?;
        let every = duration("purge.every", &Some(p.every.clone()))?;
        match (older, every) {
            (Some(older), Some(every)) if !every.is_zero() => Ok(Some((older, every))),
            _ => Err(CliError::usage("purge.every must be non-zero")),
        }
    }
}
