//! [`KafkaPublisher`]: a batch handed to librdkafka at once, awaited together.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{
    ErrorClass, PublishError, PublishOutcome, Publisher, PublisherCapabilities, StoredEvent,
};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use crate::config::{KafkaPublisherConfig, TopicRouter};
use crate::context::BrokerHealth;
use crate::delivery_wait::DeliveryWait;
use crate::error::{classify, producer_is_broken};
use crate::headers::message_headers;
use crate::key_runs::KeyRuns;

/// Publishes to Kafka: topic from a [`TopicRouter`] over the event type,
/// message key = `partition_key` (the broker keeps per-key order within a
/// partition), headers from [`crate::headers`]. The producer is idempotent.
///
/// A producer that hits a fatal error (fenced, epoch or sequence trouble
/// after a reconnect) is replaced by a fresh one; the events of that call are
/// reported as an outage, so the relay retries them without burning attempts.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: Arc<Mutex<Arc<FutureProducer<BrokerHealth>>>>,
    health: BrokerHealth,
    router: TopicRouter,
    config: KafkaPublisherConfig,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("router", &self.router)
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// A publisher with `config`, routing with `router`.
    pub fn new(config: &KafkaPublisherConfig, router: TopicRouter) -> Result<Self, KafkaError> {
        crate::config::check_bootstrap_servers(&config.bootstrap_servers)
            .map_err(KafkaError::ClientCreation)?;
        let health = BrokerHealth::default();
        let producer = config.client_config().create_with_context(health.clone())?;
        Ok(Self {
            producer: Arc::new(Mutex::new(Arc::new(producer))),
            health,
            router,
            config: config.clone(),
        })
    }

    fn current(&self) -> Arc<FutureProducer<BrokerHealth>> {
        self.producer.lock().expect("producer lock").clone()
    }

    /// Replaces `broken` (if it is still the current producer) by a new one.
    fn replace(&self, broken: &Arc<FutureProducer<BrokerHealth>>) {
        let mut current = self.producer.lock().expect("producer lock");
        if !Arc::ptr_eq(&current, broken) {
            return;
        }
        match self
            .config
            .client_config()
            .create_with_context(self.health.clone())
        {
            Ok(fresh) => {
                tracing::warn!("kafka producer hit a fatal error; replaced with a new one");
                *current = Arc::new(fresh);
            }
            Err(error) => tracing::error!(%error, "cannot create a new kafka producer"),
        }
    }

    /// Whether every broker was reported down during the last delivery
    /// window (a timeout then is the outage's, not the event's).
    fn brokers_down(&self) -> bool {
        self.health
            .down_within(self.config.delivery_timeout * 2 + Duration::from_secs(1))
    }

    /// The topic `event_type` goes to.
    pub fn topic_for(&self, event_type: &str) -> String {
        self.router.topic_for(event_type)
    }

    /// The classified failure, noting in `broken` an error that leaves the
    /// producer instance unusable.
    fn failure(&self, error: &KafkaError, broken: &mut bool) -> PublishError {
        if error.rdkafka_error_code().is_some_and(producer_is_broken) {
            *broken = true;
        }
        PublishError::new(classify(error, self.brokers_down()), error.to_string())
    }
}

#[async_trait]
impl Publisher for KafkaPublisher {
    fn capabilities(&self) -> PublisherCapabilities {
        PublisherCapabilities {
            max_batch: 1000,
            // A key's events go out in runs per topic (`crate::key_runs`) on
            // a producer that fails a partition's messages as a suffix, and
            // a key stops at its first failure.
            preserves_key_order: true,
        }
    }

    /// `kafka <bootstrap servers> topics <prefix>…`.
    fn destination(&self) -> String {
        format!(
            "kafka {} topics {}",
            self.config.bootstrap_servers,
            self.router.describe()
        )
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let producer = self.current();
        let topics: Vec<String> = batch
            .iter()
            .map(|e| self.router.topic_for(&e.event_type))
            .collect();
        // The call bounds its own wait: nothing times out inside librdkafka.
        let mut wait = DeliveryWait::until(
            tokio::time::Instant::now() + self.config.delivery_timeout + Duration::from_millis(500),
        );
        let mut runs = KeyRuns::new(batch.iter().map(|e| e.partition_key.as_str()));
        let mut outcomes: Vec<Option<PublishOutcome>> = batch.iter().map(|_| None).collect();
        // Each failed key's earliest failed event.
        let mut first_failure: HashMap<usize, usize> = HashMap::new();
        let mut fail = |slot: usize, i: usize, runs: &mut KeyRuns| {
            runs.stop(slot);
            let first = first_failure.entry(slot).or_insert(i);
            *first = (*first).min(i);
        };
        let mut timed_out = Vec::new();
        let mut broken = false;
        loop {
            if wait.expired() {
                runs.stop_all();
            }
            let wave = runs.next_wave(&topics);
            if wave.is_empty() {
                break;
            }
            // Hand the whole wave to librdkafka first, then await it.
            let mut pending = Vec::new();
            for run in &wave {
                for &i in &run.events {
                    let record = FutureRecord::to(&topics[i])
                        .key(batch[i].partition_key.as_bytes())
                        .payload(batch[i].payload.as_bytes())
                        .headers(message_headers(batch[i]));
                    match producer.send_result(record) {
                        Ok(delivery) => pending.push((run.slot, i, delivery)),
                        Err((e, _)) => {
                            outcomes[i] = Some(Err(self.failure(&e, &mut broken)));
                            fail(run.slot, i, &mut runs);
                            break;
                        }
                    }
                }
            }
            for (slot, i, delivery) in pending {
                let outcome = match wait.report(delivery, &producer).await {
                    Some(Ok(Ok(_))) => Ok(()),
                    Some(Ok(Err((e, _)))) => {
                        let failure = self.failure(&e, &mut broken);
                        if failure.class == ErrorClass::Transient && is_timeout(&e) {
                            timed_out.push(i);
                        }
                        Err(failure)
                    }
                    Some(Err(_cancelled)) => Err(PublishError::new(
                        ErrorClass::Transient,
                        "producer dropped the delivery report",
                    )),
                    None => {
                        timed_out.push(i);
                        Err(PublishError::new(
                            ErrorClass::Transient,
                            "no delivery report within the delivery timeout",
                        ))
                    }
                };
                if outcome.is_err() {
                    fail(slot, i, &mut runs);
                }
                outcomes[i] = Some(outcome);
            }
        }
        // A timeout is the event's only if the broker answers now: librdkafka
        // reports "all brokers down" late (or not at all when a proxy or a
        // firewall cuts the connections), and a cut must burn no attempts.
        // Nothing in the call delivered and something timed out: the broker
        // took none of it, which is the broker's state, not these events'.
        let none_delivered = !outcomes.iter().any(|o| matches!(o, Some(Ok(()))));
        if !timed_out.is_empty()
            && (none_delivered || self.brokers_down() || !reachable(&producer).await)
        {
            for i in timed_out {
                outcomes[i] = Some(Err(PublishError::new(
                    ErrorClass::Outage,
                    "no delivery report within the delivery timeout, and no broker answers",
                )));
            }
        }
        if broken || producer.client().fatal_error().is_some() {
            self.replace(&producer);
        }
        // What was not sent: held back behind its key's failure (the relay
        // returns it untouched), or left when the call ran out of time.
        let unsent: Vec<(usize, PublishError)> = (0..batch.len())
            .filter(|&i| outcomes[i].is_none())
            .map(|i| {
                let cause = first_failure
                    .get(&runs.slot_of(i))
                    .and_then(|&f| outcomes[f].as_ref())
                    .and_then(|o| o.as_ref().err());
                let error = match cause {
                    Some(cause) => PublishError::new(
                        cause.class,
                        format!(
                            "held back behind an earlier event of its key: {}",
                            cause.message
                        ),
                    ),
                    None => PublishError::new(
                        ErrorClass::Transient,
                        "not sent: the call's delivery timeout had passed",
                    ),
                };
                (i, error)
            })
            .collect();
        for (i, error) in unsent {
            outcomes[i] = Some(Err(error));
        }
        outcomes
            .into_iter()
            .map(|o| o.expect("every event has an outcome"))
            .collect()
    }
}

/// librdkafka gave up waiting: the broker may be gone rather than slow.
fn is_timeout(error: &KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(C::MessageTimedOut | C::RequestTimedOut | C::PurgeQueue | C::PurgeInflight)
    )
}

/// Whether a broker answers a metadata request within 300 ms (on a
/// blocking thread: librdkafka's call blocks).
async fn reachable(producer: &Arc<FutureProducer<BrokerHealth>>) -> bool {
    let producer = producer.clone();
    tokio::task::spawn_blocking(move || {
        producer
            .client()
            .fetch_metadata(None, Duration::from_millis(300))
            .is_ok()
    })
    .await
    .unwrap_or(false)
}
