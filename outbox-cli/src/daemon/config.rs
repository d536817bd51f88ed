//! The relay daemon's settings: a TOML file and/or the environment, the
//! store URL from `--url` / `OUTBOX_URL` when the file has none.
//!
//! Every key of a section can also be set as `OUTBOX_<SECTION>_<KEY>`
//! (`OUTBOX_RELAY_BATCH_SIZE=500`, `OUTBOX_BROKER_KIND=redis`,
//! `OUTBOX_HTTP_LISTEN=0.0.0.0:9464`); the environment overrides the file,
//! and without a file it is the whole configuration. Unknown keys are
//! refused, in the file and in the environment alike, so a typo is an
//! error, not a default.

use std::time::Duration;

use outbox_core::tenants::FairShare;
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
    /// Many tenants' schemas relayed by this one process.
    pub tenants: Option<TenantsSection>,
}

/// `[tenants]`: a PostgreSQL schema or a MySQL/MariaDB database per
/// tenant, every one relayed by this process on one pool per server.
/// Exactly one of `schemas`, `query`, `urls`, `list` says which tenants
/// there are; it is read again every `refresh`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantsSection {
    /// Every schema (MySQL/MariaDB: database) `LIKE` this that holds an
    /// outbox (`tenant_%`).
    pub schemas: Option<String>,
    /// A query whose rows (one text column) are the tenants' schemas.
    pub query: Option<String>,
    /// A query whose rows are `(tenant, url)` or `(tenant, url, schema)`:
    /// each tenant's outbox in the database its URL names (of the same
    /// kind as `url`), a pool of `connections` per server (PostgreSQL: per
    /// database).
    pub urls: Option<String>,
    /// The tenants' schemas, listed.
    pub list: Option<Vec<String>>,
    /// How often the tenants are read again (`30s`).
    pub refresh: Option<String>,
    /// Connections every tenant's relay on one server shares (default 8;
    /// with `urls`, each server's (PostgreSQL: database's) pool). On
    /// PostgreSQL from 8 on, two keep the shared LISTEN and read the
    /// tenants and the others serve the tenants in shards of three: a
    /// tenant's statements are cached, and rebuilt after autovacuum, on its
    /// shard's connections only.
    pub connections: Option<u32>,
    /// Run `migrate()` on a tenant's schema before its relay starts
    /// (default false: a tenant without current tables is reported and
    /// retried until it is migrated).
    pub migrate: Option<bool>,
    /// Wake idle tenants through one shared LISTEN connection, one of
    /// `connections` (default true; `relay.poll_interval` then defaults to
    /// 10 s, the backstop). False: every tenant polls.
    pub listen: Option<bool>,
    /// While another tenant is served fresh events, a tenant draining a
    /// backlog rests this many times its last batch's time between
    /// batches (default 3.0; 0 turns it off).
    pub backlog_rest: Option<f64>,
}

/// `[tenants]`, checked.
#[derive(Debug, PartialEq)]
pub struct TenantSettings {
    /// Where the tenants come from.
    pub from: TenantsFrom,
    /// How often they are read again.
    pub refresh: Duration,
    /// The pool every tenant shares.
    pub connections: u32,
    /// Whether idle tenants wake on a shared LISTEN connection.
    pub listen: bool,
    /// How backlogged tenants leave room for the others.
    pub share: FairShare,
}

/// Where a fleet's tenants come from ([`TenantsSection`], checked).
#[derive(Debug, PartialEq, Eq)]
pub enum TenantsFrom {
    /// `schemas`.
    SchemasLike(String),
    /// `query`.
    Query(String),
    /// `urls`.
    Urls(String),
    /// `list`.
    List(Vec<String>),
}

impl TenantsSection {
    /// The settings, checked; `has_listen`: the server has LISTEN/NOTIFY
    /// (PostgreSQL), so `listen` defaults to true.
    pub fn settings(&self, has_listen: bool) -> Result<TenantSettings, CliError> {
        let from = match (&self.schemas, &self.query, &self.urls, &self.list) {
            (Some(pattern), None, None, None) => TenantsFrom::SchemasLike(pattern.clone()),
            (None, Some(query), None, None) => TenantsFrom::Query(query.clone()),
            (None, None, Some(query), None) => TenantsFrom::Urls(query.clone()),
            (None, None, None, Some(list)) => TenantsFrom::List(list.clone()),
            _ => {
                return Err(CliError::usage(
                    "tenants: set exactly one of schemas, query, urls or list",
                ));
            }
        };
        let refresh =
            duration("tenants.refresh", &self.refresh)?.unwrap_or(Duration::from_secs(30));
        if refresh.is_zero() {
            return Err(CliError::usage("tenants.refresh must be non-zero"));
        }
        let listen = match (self.listen, has_listen) {
            (Some(true), false) => {
                return Err(CliError::usage(
                    "tenants.listen: MySQL/MariaDB has no LISTEN/NOTIFY; each tenant polls (remove listen)",
                ));
            }
            (listen, has_listen) => listen.unwrap_or(has_listen),
        };
        let connections = self.connections.unwrap_or(8);
        if connections == 0 {
            return Err(CliError::usage("tenants.connections must be at least 1"));
        }
        if listen && connections < 2 {
            return Err(CliError::usage(
                "tenants.connections must be at least 2 with listen (one is the shared LISTEN connection), or set listen = false",
            ));
        }
        let share = FairShare {
            backlog_rest: self
                .backlog_rest
                .unwrap_or(FairShare::default().backlog_rest),
            ..FairShare::default()
        };
        share
            .validate()
            .map_err(|e| CliError::usage(format!("tenants.{e}")))?;
        Ok(TenantSettings {
            from,
            refresh,
            connections,
            listen,
            share,
        })
    }
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
    /// Delay after an event's first failed attempt (`1s`).
    pub retry_initial_backoff: Option<String>,
    /// Longest delay between an event's attempts (`5m`).
    pub retry_max_backoff: Option<String>,
    /// First pause after a publisher outage (`500ms`); pauses double.
    pub outage_initial_pause: Option<String>,
    /// Longest pause while the outage lasts (`30s`): how long recovery can
    /// take once the cause is removed.
    pub outage_max_pause: Option<String>,
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
        /// Bound on one batch's delivery reports (`4s`, the default).
        delivery_timeout: Option<String>,
        /// librdkafka settings passed through (`"security.protocol" =
        /// "SSL"`, `"compression.type" = "zstd"`).
        #[serde(default)]
        settings: std::collections::BTreeMap<String, String>,
    },
    /// SNS: every event type to `topic_arn`, unless `[broker.routes]` names
    /// another topic for it. Credentials from the environment
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`).
    Sns {
        /// `arn:aws:sns:…` (a name ending `.fifo` is a FIFO topic).
        topic_arn: String,
        /// Default `AWS_REGION`.
        region: Option<String>,
        /// Default `AWS_ENDPOINT_URL_SNS`, `AWS_ENDPOINT_URL`, or AWS's own.
        endpoint: Option<String>,
        /// Event type → topic ARN.
        #[serde(default)]
        routes: std::collections::BTreeMap<String, String>,
    },
}

/// `[http]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// `127.0.0.1:9464`.
    pub listen: String,
    /// How long the relay may be paused by a broker outage before `/health`
    /// answers 503 (`5m` by default; `0s` at once). Until then it answers
    /// 200 with the outage in the body.
    pub outage_unhealthy_after: Option<String>,
    /// Where to serve the operators' dashboard (`/ui`); not served unless
    /// set. Actions need the token in `OUTBOX_DASHBOARD_TOKEN`.
    pub dashboard: Option<String>,
}

impl HttpSection {
    /// [`Self::dashboard`], checked: a path of its own.
    pub fn dashboard_path(&self) -> Result<Option<String>, CliError> {
        let Some(path) = &self.dashboard else {
            return Ok(None);
        };
        let valid = path.starts_with('/')
            && path.len() > 1
            && !path.ends_with('/')
            && !["/metrics", "/health"].contains(&path.as_str());
        if !valid {
            return Err(CliError::usage(format!(
                "http.dashboard {path:?}: a path such as \"/ui\" (not /, /metrics or /health)"
            )));
        }
        Ok(Some(path.clone()))
    }

    /// [`Self::outage_unhealthy_after`], parsed.
    pub fn outage_unhealthy_after(&self) -> Result<Duration, CliError> {
        Ok(
            duration("http.outage_unhealthy_after", &self.outage_unhealthy_after)?
                .unwrap_or(DEFAULT_OUTAGE_UNHEALTHY_AFTER),
        )
    }
}

/// `/health` turns 503 after this long in a broker outage, unless
/// `[http] outage_unhealthy_after` says otherwise.
pub const DEFAULT_OUTAGE_UNHEALTHY_AFTER: Duration = Duration::from_secs(300);

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
    /// Reads `path` (if any), overrides it with `OUTBOX_<SECTION>_<KEY>`
    /// variables from `environment`, and checks the result.
    pub fn load(
        path: Option<&std::path::Path>,
        environment: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, CliError> {
        let source = path.map_or_else(|| "the environment".to_owned(), |p| p.display().to_string());
        let mut table = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| CliError::usage(format!("{source}: {e}")))?;
                toml::from_str::<toml::Table>(&text)
                    .map_err(|e| CliError::usage(format!("{source}: {e}")))?
            }
            None => toml::Table::new(),
        };
        let overridden = overlay_environment(&mut table, environment)
            .map_err(|e| CliError::usage(format!("environment: {e}")))?;
        let source = if overridden && path.is_some() {
            format!("{source} with OUTBOX_* overrides")
        } else {
            source
        };
        toml::Table::try_into(table).map_err(|e| CliError::usage(format!("{source}: {e}")))
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
        if let Some(d) = duration("relay.outage_initial_pause", &r.outage_initial_pause)? {
            config.outage.initial_pause = d;
        }
        if let Some(d) = duration("relay.outage_max_pause", &r.outage_max_pause)? {
            config.outage.max_pause = d;
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
        if let Some(d) = duration("relay.retry_initial_backoff", &r.retry_initial_backoff)? {
            config.retry.initial_interval = d;
        }
        if let Some(d) = duration("relay.retry_max_backoff", &r.retry_max_backoff)? {
            config.retry.max_interval = d;
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

/// The sections a variable `OUTBOX_<SECTION>_<KEY>` can set.
const SECTIONS: [&str; 5] = ["relay", "broker", "http", "purge", "tenants"];

/// Sets `table.section.key` from each `OUTBOX_<SECTION>_<KEY>` variable
/// (digits-only values as integers, the rest as strings); other variables
/// are left alone. Returns whether any was set.
fn overlay_environment(
    table: &mut toml::Table,
    environment: impl IntoIterator<Item = (String, String)>,
) -> Result<bool, String> {
    let mut overridden = false;
    for (name, value) in environment {
        let Some(rest) = name.strip_prefix("OUTBOX_") else {
            continue;
        };
        let rest = rest.to_ascii_lowercase();
        let Some((section, key)) = SECTIONS.iter().find_map(|section| {
            rest.strip_prefix(section)
                .and_then(|r| r.strip_prefix('_'))
                .filter(|key| !key.is_empty())
                .map(|key| (*section, key.to_owned()))
        }) else {
            continue;
        };
        let entry = table
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(section_table) = entry else {
            return Err(format!("{section} is not a section"));
        };
        let value = match value.parse::<i64>() {
            Ok(n) if value.bytes().all(|b| b.is_ascii_digit()) => toml::Value::Integer(n),
            _ => toml::Value::String(value),
        };
        section_table.insert(key, value);
        overridden = true;
    }
    Ok(overridden)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_environment_alone_is_a_configuration() {
        let config = DaemonConfig::load(
            None,
            env(&[
                ("OUTBOX_BROKER_KIND", "redis"),
                ("OUTBOX_BROKER_URL", "redis://127.0.0.1:6379"),
                ("OUTBOX_RELAY_BATCH_SIZE", "250"),
                ("OUTBOX_RELAY_POISON", "block"),
                ("OUTBOX_RELAY_RETRY_INITIAL_BACKOFF", "2s"),
                ("OUTBOX_HTTP_LISTEN", "127.0.0.1:9464"),
                ("OUTBOX_PG_URL", "ignored: not a section"),
                ("PATH", "/usr/bin"),
            ]),
        )
        .unwrap();
        let relay = config.relay_config().unwrap();
        assert_eq!(relay.batch_size, 250);
        assert_eq!(relay.poison, PoisonPolicy::Block);
        assert_eq!(relay.retry.initial_interval, Duration::from_secs(2));
        assert!(matches!(config.broker, BrokerSection::Redis { .. }));
        assert_eq!(config.http.unwrap().listen, "127.0.0.1:9464");
    }

    #[test]
    fn the_environment_overrides_the_file_and_its_typos_are_refused() {
        let path = std::env::temp_dir().join(format!("outbox-config-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            "[relay]\nbatch_size = 100\nordering = \"unordered\"\n\n[broker]\nkind = \"kafka\"\nbootstrap = \"a:9092\"\n[broker.settings]\n\"compression.type\" = \"zstd\"\n",
        )
        .unwrap();
        let config =
            DaemonConfig::load(Some(&path), env(&[("OUTBOX_RELAY_BATCH_SIZE", "7")])).unwrap();
        let relay = config.relay_config().unwrap();
        assert_eq!(relay.batch_size, 7, "the environment wins");
        assert_eq!(
            relay.ordering,
            Ordering::Unordered,
            "the file's other keys stay"
        );
        let BrokerSection::Kafka { settings, .. } = &config.broker else {
            panic!("kafka");
        };
        assert_eq!(settings["compression.type"], "zstd");

        let typo = DaemonConfig::load(Some(&path), env(&[("OUTBOX_RELAY_BATCHSIZE", "7")]))
            .unwrap_err()
            .to_string();
        assert!(typo.contains("unknown field `batchsize`"), "{typo}");
        assert!(typo.contains("OUTBOX_* overrides"), "{typo}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_dashboard_needs_a_path_of_its_own() {
        let section = |path: &str| HttpSection {
            listen: "127.0.0.1:0".into(),
            outage_unhealthy_after: None,
            dashboard: Some(path.into()),
        };
        assert_eq!(
            section("/ui").dashboard_path().unwrap().as_deref(),
            Some("/ui")
        );
        for bad in ["/", "ui", "/ui/", "/metrics", "/health"] {
            assert!(section(bad).dashboard_path().is_err(), "{bad}");
        }
    }
}
