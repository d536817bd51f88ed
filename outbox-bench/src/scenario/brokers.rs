//! The PostgreSQL drain again, to Kafka (loopback tansu), Redis Streams and
//! SNS (the moto emulator, a topic without subscribers) instead of the
//! no-op publisher: events/s and the ratio to the no-op drain of the same
//! key shape (1 to 100,000 keys and Zipf, per-key order, batch 1,000). SNS figures are the emulator's (a Python server doing the fan-out
//! inside each request), not AWS's; its backlog is smaller.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Ordering, Publisher};
use outbox_kafka::{KafkaPublisher, KafkaPublisherConfig, TopicRouter};
use outbox_redis::{RedisPublisher, StreamRouter};
use outbox_sns::{SnsPublisher, TopicRouter as SnsRouter};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

use super::keys::{SHAPES, Shape, keys_of};
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
    let n_sns = scale.pick(5_000, 300);
    let pool = env::pg_pool(8).await?;
    let store = Arc::new(env::pg_store(&pool).await?);
    let redis = redis::Client::open(env::redis_url())?
        .get_connection_manager()
        .await
        .map_err(|e| format!("Redis unreachable at {}: {e}", env::redis_url()))?;
    let mut rounds = Rounds::default();
    // The smoke set takes 1,000 keys.
    let shapes: &[(&str, Shape)] = if scale.quick { &SHAPES[2..3] } else { &SHAPES };
    for round in 0..scale.rounds {
        let runs = shapes.iter().flat_map(|&(shape_name, shape)| {
            ["noop", "kafka", "redis"]
                .into_iter()
                .map(move |broker| (broker, shape_name, shape))
        });
        // SNS once per round, on the drain's usual 10,000 keys.
        for (broker, shape_name, shape) in runs.chain([("sns", "10k-keys", Shape::Keys(10_000))]) {
            let contender = format!("{broker}-{shape_name}");
            if !scale.includes(&contender) {
                continue;
            }
            let n = if broker == "sns" { n_sns } else { n };
            let keys = keys_of(shape, round, n);
            env::pg_reset(&pool).await?;
            env::pg_fill_with(&store, n, |i| env::event_for_key(round, i, keys[i])).await?;
            // One name per drain: a topic or stream left by an earlier
            // shape would be reused (Kafka refuses to create it twice).
            let tag = format!(
                "bench{}r{round}{}",
                std::process::id(),
                shape_name.replace('-', "")
            );
            let publisher: Box<dyn Publisher> = match broker {
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
                "sns" => Box::new(sns_destination(&tag).await?),
                _ => Box::new(RedisPublisher::new(
                    redis.clone(),
                    StreamRouter::with_prefix(format!("{tag}:")),
                )),
            };
            // The publisher's own batch limit where it has one below ours.
            let batch = BATCH.min(publisher.capabilities().max_batch);
            let counting = Arc::new(CountingPublisher::wrapping(publisher, batch));
            let config = relay_run::config(batch, Ordering::PerKey);
            let elapsed = relay_run::drain(store.clone(), counting, config, 1, n as u64).await?;
            if broker == "redis" {
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
            rounds.add(&contender, "events/s", rate(n as u64, elapsed), true);
            progress(format!(
                "round {round} {contender}: {:.0} events/s",
                rate(n as u64, elapsed)
            ));
        }
    }
    rounds.finish(NAME, report);
    let m = |report: &Report, c: &str| report.median(NAME, c, "events/s").unwrap_or(f64::NAN);
    for (shape_name, _) in shapes {
        let noop = m(report, &format!("noop-{shape_name}"));
        for broker in ["kafka", "redis"] {
            // Reported, no bound in the issue: the share of the no-op drain kept.
            report.target(TargetCheck::reported(
                format!("drain: {broker} / no-op publisher, {shape_name}"),
                m(report, &format!("{broker}-{shape_name}")) / noop,
            ));
        }
    }
    report.target(TargetCheck::reported(
        "drain: sns / no-op publisher, 10k-keys",
        m(report, "sns-10k-keys") / m(report, "noop-10k-keys"),
    ));
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

/// A topic named after `tag`, and a publisher to it. No queue is
/// subscribed: moto appends to a queue in time that grows with the queue's
/// length (about 200 messages/s into an empty queue, 20/s past 1,500
/// messages, measured with boto3 alone), so a subscribed queue would time
/// the emulator's queue, not the publisher. Delivery through a queue is
/// what `outbox-sns`'s tests check.
async fn sns_destination(tag: &str) -> Result<SnsPublisher, Error> {
    let config = env::sns_config();
    let topic = aws_sdk_sns::Client::new(&config)
        .create_topic()
        .name(tag)
        .send()
        .await
        .map_err(|e| {
            format!(
                "SNS/SQS emulator unreachable at {} (scripts/sns.sh starts it): {e:?}",
                env::sns_endpoint()
            )
        })?
        .topic_arn
        .ok_or("CreateTopic returned no ARN")?;
    Ok(SnsPublisher::new(&config, SnsRouter::to(topic)))
}
