//! [`KafkaPublisher`]: a batch handed to librdkafka at once, awaited together.

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{
    ErrorClass, PublishError, PublishOutcome, Publisher, PublisherCapabilities, StoredEvent,
};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::config::{KafkaPublisherConfig, TopicRouter};
use crate::context::BrokerHealth;
use crate::error::classify;
use crate::headers::message_headers;

/// Publishes to Kafka: topic from a [`TopicRouter`] over the event type,
/// message key = `partition_key` (the broker keeps per-key order within a
/// partition), headers from [`crate::headers`]. The producer is idempotent.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: Arc<FutureProducer<BrokerHealth>>,
    health: BrokerHealth,
    router: TopicRouter,
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
        let health = BrokerHealth::default();
        let producer = config.client_config().create_with_context(health.clone())?;
        Ok(Self {
            producer: Arc::new(producer),
            health,
            router,
        })
    }

    /// The topic `event_type` goes to.
    pub fn topic_for(&self, event_type: &str) -> String {
        self.router.topic_for(event_type)
    }

    fn failure(&self, error: &KafkaError) -> PublishError {
        PublishError::new(classify(error, self.health.all_down()), error.to_string())
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
                self.producer.send_result(record).map_err(|(e, _)| e)
            })
            .collect();
        let mut outcomes = Vec::with_capacity(batch.len());
        for queued in queued {
            let outcome = match queued {
                Err(e) => Err(self.failure(&e)),
                Ok(delivery) => match delivery.await {
                    Ok(Ok(_)) => {
                        self.health.delivered();
                        Ok(())
                    }
                    Ok(Err((e, _))) => Err(self.failure(&e)),
                    Err(_cancelled) => Err(PublishError::new(
                        ErrorClass::Transient,
                        "producer dropped the delivery report",
                    )),
                },
            };
            outcomes.push(outcome);
        }
        outcomes
    }
}
