//! [`KafkaPublisher`]: a batch handed to librdkafka at once, awaited together.

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
use crate::error::{classify, producer_is_broken};
use crate::headers::message_headers;

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
            // A message rejected locally (too large) does not stop later
            // messages of its key in the same call.
            preserves_key_order: false,
        }
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let producer = self.current();
        let topics: Vec<String> = batch
            .iter()
            .map(|e| self.router.topic_for(&e.event_type))
            .collect();
        // Hand every message to librdkafka first, then await them together.
        let queued: Vec<_> = batch
            .iter()
            .zip(&topics)
            .map(|(event, topic)| {
                let record = FutureRecord::to(topic)
                    .key(event.partition_key.as_bytes())
                    .payload(event.payload.as_bytes())
                    .headers(message_headers(event));
                producer.send_result(record).map_err(|(e, _)| e)
            })
            .collect();
        // Bound the wait ourselves: a request in flight when the connection
        // drops may outlive `message.timeout.ms`.
        let deadline =
            tokio::time::Instant::now() + self.config.delivery_timeout + Duration::from_millis(500);
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut timed_out = Vec::new();
        let mut broken = false;
        for queued in queued {
            let outcome = match queued {
                Err(e) => Err(self.failure(&e, &mut broken)),
                Ok(delivery) => match tokio::time::timeout_at(deadline, delivery).await {
                    Ok(Ok(Ok(_))) => Ok(()),
                    Ok(Ok(Err((e, _)))) => {
                        let failure = self.failure(&e, &mut broken);
                        if failure.class == ErrorClass::Transient && is_timeout(&e) {
                            timed_out.push(outcomes.len());
                        }
                        Err(failure)
                    }
                    Ok(Err(_cancelled)) => Err(PublishError::new(
                        ErrorClass::Transient,
                        "producer dropped the delivery report",
                    )),
                    Err(_elapsed) => {
                        timed_out.push(outcomes.len());
                        Err(PublishError::new(
                            ErrorClass::Transient,
                            "no delivery report within the delivery timeout",
                        ))
                    }
                },
            };
            outcomes.push(outcome);
        }
        // A timeout is the event's only if the broker answers now: librdkafka
        // reports "all brokers down" late (or not at all when a proxy or a
        // firewall cuts the connections), and a cut must burn no attempts.
        // Nothing in the call delivered and something timed out: the broker
        // took none of it, which is the broker's state, not these events'.
        let none_delivered = outcomes.iter().all(Result::is_err);
        if !timed_out.is_empty()
            && (none_delivered || self.brokers_down() || !reachable(&producer).await)
        {
            for i in timed_out {
                outcomes[i] = Err(PublishError::new(
                    ErrorClass::Outage,
                    "no delivery report within the delivery timeout, and no broker answers",
                ));
            }
        }
        if broken || producer.client().fatal_error().is_some() {
            self.replace(&producer);
        }
        outcomes
    }
}

/// librdkafka gave up waiting: the broker may be gone rather than slow.
fn is_timeout(error: &KafkaError) -> bool {
    use rdkafka::error::RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(C::MessageTimedOut | C::RequestTimedOut)
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
