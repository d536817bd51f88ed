//! `outbox relay`: one relay process a team deploys beside its service,
//! configured by a TOML file, drained gracefully on SIGTERM/SIGINT.

mod backlog;
mod config;
mod http;
mod served;
mod tenants;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use outbox_core::{CancellationToken, OutboxStore, Publisher, Relay, RelayConfig};

use crate::error::CliError;
use crate::store::{Store, Tables};
use config::{BrokerSection, DaemonConfig};

/// Connections the relay's pool may hold (claims, settlements while the
/// next claim runs, heartbeats, the wake-up listener, purges).
const RELAY_CONNECTIONS: u32 = 8;

/// Runs the relay until a signal (exit 0 after draining) or a store error
/// retrying cannot cure (exit 1 with the error).
pub async fn run(
    url: Option<&str>,
    tables: &Tables,
    path: Option<&std::path::Path>,
) -> Result<(), CliError> {
    let config = DaemonConfig::load(path, std::env::vars())?;
    let relay_config = config.relay_config()?;
    let purge = config.purge_schedule()?;
    // One precedence for every setting: flag > environment > file >
    // default (clap has already put a flag before OUTBOX_URL,
    // OUTBOX_SCHEMA and OUTBOX_PREFIX; the [relay], [broker], [http] and
    // [purge] keys take OUTBOX_<SECTION>_<KEY> over the file).
    let url = url.or(config.url.as_deref()).ok_or_else(|| {
        CliError::usage("no store URL: pass --url, set OUTBOX_URL or set url in the file")
    })?;
    let tables = Tables {
        schema: tables.schema.clone().or_else(|| config.schema.clone()),
        prefix: tables.prefix.clone().or_else(|| config.prefix.clone()),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();

    let publisher = publisher(&config.broker)?;
    if let Some(section) = &config.tenants {
        return tenants::run(
            url,
            tables.schema.as_deref(),
            tables.prefix.as_deref(),
            &config,
            section,
            relay_config,
            publisher,
        )
        .await;
    }
    let destination = publisher.destination();
    let store = Store::open(url, &tables, false, RELAY_CONNECTIONS).await?;
    let shutdown = CancellationToken::new();
    let running = Arc::new(AtomicBool::new(true));
    let outage_unhealthy_after = config
        .http
        .as_ref()
        .map(|h| h.outage_unhealthy_after())
        .transpose()?;
    // The recorder before the relay, so its gauges exist from the start.
    let recorder = match &config.http {
        Some(_) => Some(http::install_recorder()?),
        None => None,
    };
    let relay = build_relay(&store, publisher, relay_config.clone()).await?;
    if let (Some(section), Some(handle)) = (&config.http, recorder) {
        let listener = tokio::net::TcpListener::bind(&section.listen)
            .await
            .map_err(|e| CliError::usage(format!("http.listen {}: {e}", section.listen)))?;
        tracing::info!(listen = %section.listen, "serving /metrics and /health");
        let dashboard = section.dashboard_path()?.map(|base| {
            tracing::info!(path = %base, "serving the dashboard");
            crate::dashboard::Ui::Store(crate::dashboard::Dashboard::start(
                store.clone(),
                dashboard_settings(base, &listener),
            ))
        });
        tokio::spawn(http::serve(
            listener,
            handle,
            Some(served::Served::Store(store.clone())),
            http::Liveness {
                running: running.clone(),
                watched: http::Watched::Relay(relay.health()),
                outage_unhealthy_after: outage_unhealthy_after
                    .unwrap_or(config::DEFAULT_OUTAGE_UNHEALTHY_AFTER),
            },
            dashboard,
        ));
    }
    if let Some((older_than, every)) = purge {
        tokio::spawn(purge_loop(
            served::Served::Store(store.clone()),
            older_than,
            every,
            shutdown.clone(),
        ));
    }
    tokio::spawn(stop_on_signal(shutdown.clone()));

    tracing::info!(
        relay = %relay_config.relay_id,
        store = store.kind(),
        url = %redacted(url),
        schema = tables.schema.as_deref().unwrap_or("(the connection's default)"),
        prefix = tables.prefix.as_deref().unwrap_or("outbox"),
        destination = %destination,
        batch_size = relay_config.batch_size,
        lease = ?relay_config.lease_duration,
        publish_timeout = ?relay_config.publish_timeout,
        poll_interval = ?relay_config.poll_interval,
        ordering = ?relay_config.ordering,
        poison = ?relay_config.poison,
        outage = ?relay_config.outage,
        "relay starting"
    );
    let result = relay.run(shutdown).await;
    running.store(false, AtomicOrdering::SeqCst);
    match result {
        Ok(report) => {
            log_stopped(&report, "relay stopped");
            Ok(())
        }
        Err(error) => Err(CliError::failure(error)),
    }
}

/// The last line of a drained daemon (`relay stopped` is what operators
/// and the tests look for).
fn log_stopped(report: &outbox_core::RelayReport, message: &'static str) {
    tracing::info!(
        published = report.published,
        failed = report.failed,
        retried = report.retried,
        drained = report.drained,
        "{message}"
    );
}

/// `url` with any password replaced by `***` (start-up logs and pages).
pub(crate) use outbox_sqlx::without_password as redacted;

fn publisher(broker: &BrokerSection) -> Result<Arc<dyn Publisher>, CliError> {
    match broker {
        BrokerSection::Redis { url, stream_prefix } => {
            let router = outbox_redis::StreamRouter::with_prefix(
                stream_prefix.clone().unwrap_or_else(|| "outbox:".into()),
            );
            let publisher = outbox_redis::RedisPublisher::from_url(url, router)
                .map_err(|e| CliError::usage(format!("broker.url: {e}")))?;
            Ok(Arc::new(publisher))
        }
        BrokerSection::Kafka {
            bootstrap,
            topic_prefix,
            delivery_timeout,
            settings,
        } => {
            let router =
                outbox_kafka::TopicRouter::with_prefix(topic_prefix.clone().unwrap_or_default());
            let mut kafka = outbox_kafka::KafkaPublisherConfig::new(bootstrap);
            if let Some(timeout) = delivery_timeout {
                kafka.delivery_timeout = crate::duration::parse(timeout)
                    .map_err(|e| CliError::usage(format!("broker.delivery_timeout: {e}")))?;
            }
            for (key, value) in settings {
                kafka = kafka.set(key, value);
            }
            let publisher = outbox_kafka::KafkaPublisher::new(&kafka, router)
                .map_err(|e| CliError::usage(format!("broker: {e}")))?;
            Ok(Arc::new(publisher))
        }
        BrokerSection::Sns {
            topic_arn,
            region,
            endpoint,
            routes,
        } => {
            if !topic_arn.starts_with("arn:") {
                return Err(CliError::usage(format!(
                    "broker.topic_arn {topic_arn:?}: expected arn:aws:sns:…"
                )));
            }
            let config = crate::aws::sdk_config(
                "broker (sns)",
                "SNS",
                region.as_deref(),
                endpoint.as_deref(),
            )?;
            let router = routes.iter().fold(
                outbox_sns::TopicRouter::to(topic_arn),
                |router, (event_type, arn)| router.route(event_type, arn),
            );
            Ok(Arc::new(outbox_sns::SnsPublisher::new(&config, router)))
        }
    }
}

/// The relay over `store`, waking on LISTEN/NOTIFY where the store has it.
async fn build_relay(
    store: &Store,
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
) -> Result<Relay<dyn OutboxStore, dyn Publisher>, CliError> {
    let (relay_store, wake_up): (
        Arc<dyn OutboxStore>,
        Option<outbox_sqlx::postgres::PgWakeUp>,
    ) = match store {
        Store::Postgres(pg) => {
            // LISTEN/NOTIFY ends idle waits at once; polling stays the backstop.
            let wake_up = match pg.wake_up().await {
                Ok(wake_up) => Some(wake_up),
                Err(error) => {
                    tracing::warn!(%error, "no LISTEN connection; polling only");
                    None
                }
            };
            (Arc::new(pg.clone()), wake_up)
        }
        Store::MySql(my) => (Arc::new(my.clone()), None),
        Store::Sqlite(lite) => (Arc::new(lite.clone()), None),
    };
    let relay = Relay::new(relay_store, publisher, config)
        .map_err(|e| CliError::usage(format!("relay: {}", e.0)))?;
    Ok(match wake_up {
        Some(wake_up) => relay.with_wake_up(wake_up),
        None => relay,
    })
}

/// The dashboard's settings under the daemon, mounted at `base`: the
/// token from `OUTBOX_DASHBOARD_TOKEN`, loopback names only when it
/// listens on loopback.
fn dashboard_settings(
    base: String,
    listener: &tokio::net::TcpListener,
) -> crate::dashboard::Settings {
    crate::dashboard::Settings {
        base,
        token: std::env::var("OUTBOX_DASHBOARD_TOKEN").ok(),
        sample_every: Duration::from_secs(10),
        loopback_only: listener
            .local_addr()
            .is_ok_and(|address| address.ip().is_loopback()),
        tenant: None,
    }
}

/// Cancels `shutdown` on SIGTERM or SIGINT.
pub(crate) async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot watch SIGTERM/SIGINT");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
    shutdown.cancel();
}

/// Deletes published events older than `older_than` from every store
/// served (each tenant's in turn), every `every`, until shutdown.
async fn purge_loop(
    served: served::Served,
    older_than: Duration,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let mut purged = 0u64;
        for (tenant, store) in served.stores() {
            let tenant = tenant.as_ref().map(|t| t.as_str());
            match store {
                Ok(store) => purged += purge_store(&store, older_than, tenant).await,
                Err(error) => tracing::warn!(%error, tenant, "purge failed; next round retries"),
            }
        }
        tracing::info!(purged, "purged published events");
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// One store's purge, a thousand rows a call until a call deletes fewer.
async fn purge_store(store: &Store, older_than: Duration, tenant: Option<&str>) -> u64 {
    let mut purged = 0u64;
    loop {
        match store.admin().purge_published(older_than, 1000).await {
            Ok(n) => {
                purged += n;
                if n < 1000 {
                    return purged;
                }
            }
            Err(error) => {
                tracing::warn!(%error, tenant, "purge failed; next round retries");
                return purged;
            }
        }
    }
}
