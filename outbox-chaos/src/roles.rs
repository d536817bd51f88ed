//! The processes the run kills: a relay (PostgreSQL outbox → Redis Streams
//! or Kafka) and a consumer (the broker → PostgreSQL inbox and effect). The
//! broker is named by its URL: `redis://host:port` or `kafka://host:port`.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::relay::OutagePolicy;
use outbox_core::store::RelayId;
use outbox_core::{CancellationToken, Relay, RelayConfig};
use outbox_kafka::{
    KafkaConsumer, KafkaConsumerConfig, KafkaPublisher, KafkaPublisherConfig, TopicRouter,
};
use outbox_redis::{
    ConnectionSettings, ConsumerConfig, RedisConsumer, RedisPublisher, StreamRouter,
};
use outbox_sqlx::StoreConfig;
use outbox_sqlx::postgres::{EffectLog, PgStore, RecordEffect};
use sqlx::postgres::PgPoolOptions;

use crate::Error;

/// The stream every event goes to (the default router's name for the type).
pub(crate) const STREAM: &str = "outbox:invoice.paid";
/// Kafka topics are `{prefix}{event_type}`.
pub(crate) const KAFKA_PREFIX: &str = "chaos.";
/// The topic every event goes to on Kafka.
pub(crate) const KAFKA_TOPIC: &str = "chaos.invoice.paid";
/// Partitions of the Kafka topic.
pub(crate) const KAFKA_PARTITIONS: i32 = 4;
/// The consumer group, and the inbox's consumer name.
pub(crate) const GROUP: &str = "chaos";
/// The effects table the consumer writes in its inbox transaction.
pub(crate) const EFFECTS_SCHEMA: &str = "public";
/// The consumers' effects (an [`EffectLog`] in [`EFFECTS_SCHEMA`]).
pub(crate) const EFFECTS: &str = "public.effects";

fn pool(url: &str) -> Result<sqlx::PgPool, Error> {
    Ok(
        outbox_sqlx::guard_cancelled_transactions(PgPoolOptions::new())
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(url)?,
    )
}

/// The Redis connection settings of the run's relays and consumer: the
/// README's way (`from_url`, connected lazily, reconnecting by itself), with
/// timeouts short enough for the run's outages.
fn redis_settings() -> ConnectionSettings {
    ConnectionSettings {
        connect_timeout: Duration::from_secs(1),
        response_timeout: Duration::from_secs(2),
        ..ConnectionSettings::default()
    }
}

/// Cancelled on SIGTERM: the process drains and exits.
fn on_sigterm() -> Result<CancellationToken, Error> {
    let token = CancellationToken::new();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        term.recv().await;
        cancel.cancel();
    });
    Ok(token)
}

/// One relay until SIGTERM (or SIGKILL, which is the point).
pub(crate) async fn relay(pg: &str, broker: &str, name: &str) -> Result<(), Error> {
    let store = Arc::new(PgStore::new(pool(pg)?, StoreConfig::default()));
    // As a service does at every start (a deploy): on current tables it
    // changes nothing and takes no lock; through a database outage, again.
    while let Err(error) = store.migrate().await {
        if !error.is_retryable() {
            return Err(error.into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Short leases so a killed relay's events come back within the run.
    let mut config = RelayConfig {
        relay_id: RelayId::new(name),
        batch_size: 100,
        lease_duration: Duration::from_secs(3),
        publish_timeout: Duration::from_secs(1),
        poll_interval: Duration::from_millis(50),
        heartbeat_interval: Duration::from_secs(1),
        outage: OutagePolicy {
            initial_pause: Duration::from_millis(200),
            max_pause: Duration::from_secs(2),
        },
        ..RelayConfig::default()
    };
    match broker.strip_prefix("kafka://") {
        Some(bootstrap) => {
            // A delivery is bounded by its timeout, inside the relay's
            // publish timeout, inside the lease.
            let mut kafka = KafkaPublisherConfig::new(bootstrap);
            kafka.delivery_timeout = Duration::from_secs(2);
            config.publish_timeout = Duration::from_secs(3);
            config.lease_duration = Duration::from_secs(6);
            let publisher = Arc::new(KafkaPublisher::new(
                &kafka,
                TopicRouter::with_prefix(KAFKA_PREFIX),
            )?);
            Relay::new(store, publisher, config)?
                .run(on_sigterm()?)
                .await?;
        }
        None => {
            let publisher = Arc::new(RedisPublisher::from_url_with(
                broker,
                StreamRouter::default(),
                redis_settings(),
            )?);
            Relay::new(store, publisher, config)?
                .run(on_sigterm()?)
                .await?;
        }
    }
    Ok(())
}

/// One consumer until SIGTERM (or SIGKILL).
pub(crate) async fn consume(pg: &str, broker: &str, name: &str) -> Result<(), Error> {
    let pool = pool(pg)?;
    let effects = RecordEffect {
        log: EffectLog::open(&pool, EFFECTS_SCHEMA)?,
    };
    let store = PgStore::new(pool, StoreConfig::default());
    if let Some(bootstrap) = broker.strip_prefix("kafka://") {
        let mut config = KafkaConsumerConfig::new(bootstrap, GROUP, vec![KAFKA_TOPIC.into()]);
        // A killed member's partitions move on after the session timeout.
        config.librdkafka.extend([
            ("session.timeout.ms".to_owned(), "6000".to_owned()),
            ("heartbeat.interval.ms".to_owned(), "500".to_owned()),
            ("client.id".to_owned(), name.to_owned()),
        ]);
        let consumer = KafkaConsumer::new(config, store.inbox(), effects)?;
        let report = consumer.run(on_sigterm()?).await?;
        eprintln!("consumer {name}: {report:?}");
        return Ok(());
    }
    let redis_url = broker;
    let mut config = ConsumerConfig::new(GROUP, name, vec![STREAM.into()]);
    config.block = Duration::from_millis(200);
    let consumer =
        RedisConsumer::from_url_with(redis_url, redis_settings(), config, store.inbox(), effects)?;
    let report = consumer.run(on_sigterm()?).await?;
    eprintln!("consumer {name}: {report:?}");
    Ok(())
}
