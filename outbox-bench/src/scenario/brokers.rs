//! The PostgreSQL drain again, to Kafka (loopback tansu) and Redis Streams
//! instead of the no-op publisher: events/s and the ratio to the no-op drain
//! of the same round.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Ordering, Publisher};
use outbox_kafka::{KafkaPublisher, KafkaPublisherConfig, TopicRouter};
use outbox_redis::{RedisPublisher, StreamRouter};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

use super::{Rounds, Scale, progress, rate};
use crate::counting::CountingPublisher;
use crate::env::{self, Error};
use crate::relay_run;
use crate::report::{Report, TargetCheck};

/// Scenario name.
pub const NAME: &str = "drain-brokers";
/// Events per claim and per publish call (librdkafka and the Redis pipeline
/// take the batch at once).
const BATCH: usize = 1_000;

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let n = scale.pick(50_000, 2_000);
    let pool = env::pg_pool(8).await?;
    let store = Arc::new(env::pg_store(&pool).await?);
    let redis = redis::Client::open(env::redis_url())?
        .get_connection_manager()
        .await
        .map_err(|e| format!("Redis unreachable at {}: {e}", env::redis_url()))?;
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        for contender in ["noop", "kafka", "redis"] {
            if !scale.includes(contender) {
                continue;
            }
            env::pg_reset(&pool).await?;
            env::pg_fill(&store, round, n).await?;
            let tag = format!("bench{}r{round}", std::process::id());
            let publisher: Box<dyn Publisher> = match contender {
                "noop" => Box::new(outbox_core_noop()),
                "kafka" => {
                    let topic = format!("{tag}.invoice.paid");
                    create_topic(&topic).await?;
                    let router = TopicRouter::with_prefix(format!("{tag}."));
                    Box::new(KafkaPublisher::new(
                        &KafkaPublisherConfig::new(env::kafka_bootstrap()),
                        router,
                    )?)
                }
                _ => Box::new(RedisPublisher::new(
                    redis.clone(),
                    StreamRouter::with_prefix(format!("{tag}:")),
                )),
            };
            let counting = Arc::new(CountingPublisher::wrapping(publisher, BATCH));
            let config = relay_run::config(BATCH, Ordering::PerKey);
            let elapsed = relay_run::drain(store.clone(), counting, config, 1, n as u64).await?;
            if contender == "redis" {
                let stream = format!("{tag}:invoice.paid");
                let mut conn = redis.clone();
                let len: u64 = redis::cmd("XLEN")
                    .arg(&stream)
                    .query_async(&mut conn)
                    .await?;
                let _: () = redis::cmd("DEL")
                    .arg(&stream)
                    .query_async(&mut conn)
                    .await?;
                if len < n as u64 {
                    return Err(format!("redis stream holds {len} of {n} entries").into());
                }
            }
            rounds.add(contender, "events/s", rate(n as u64, elapsed), true);
            progress(format!(
                "round {round} {contender}: {:.0} events/s",
                rate(n as u64, elapsed)
            ));
        }
    }
    rounds.finish(NAME, report);
    let noop = report.median(NAME, "noop", "events/s").unwrap_or(f64::NAN);
    for broker in ["kafka", "redis"] {
        let ratio = report.median(NAME, broker, "events/s").unwrap_or(f64::NAN) / noop;
        // Reported, no bound in the issue: the share of the no-op drain kept.
        report.target(TargetCheck::reported(
            format!("drain: {broker} / no-op publisher"),
            ratio,
        ));
    }
    pool.close().await;
    Ok(())
}

fn outbox_core_noop() -> crate::counting::NoBroker {
    crate::counting::NoBroker
}

/// Creates `topic` with four partitions on the loopback broker.
async fn create_topic(topic: &str) -> Result<(), Error> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", env::kafka_bootstrap())
        .create()?;
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, 4, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| {
            format!(
                "Kafka unreachable at {} (scripts/kafka.sh starts it): {e}",
                env::kafka_bootstrap()
            )
        })?;
    for result in results {
        result.map_err(|(t, e)| format!("creating topic {t}: {e}"))?;
    }
    Ok(())
}
