//! [`DeliveryWait`]: one publish call's bound on its delivery reports.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::{DeliveryFuture, FutureProducer, Producer, PurgeConfig};
use tokio::time::Instant;

use crate::context::BrokerHealth;

/// How long purged messages' reports may take to arrive.
const PURGE_GRACE: Duration = Duration::from_secs(2);

/// A delivery report, as the future yields it.
pub(crate) type Report = <DeliveryFuture as Future>::Output;

/// Awaits delivery reports until the call's deadline. Messages never time
/// out inside librdkafka (a local timeout can fail a message while a later
/// one of its partition is still delivered), so at the deadline the
/// producer's queued and in-flight messages are purged: each then reports
/// failure, and a partition's failures stay a suffix of its messages.
///
/// A purge takes every message of the producer, those of other calls
/// sharing it included; they report a purge, are retried, and their keys'
/// order holds the same way.
pub(crate) struct DeliveryWait {
    deadline: Instant,
    purged: bool,
}

impl DeliveryWait {
    /// A wait ending at `deadline`.
    pub fn until(deadline: Instant) -> Self {
        Self {
            deadline,
            purged: false,
        }
    }

    /// Whether the deadline passed: send nothing more in this call.
    pub fn expired(&self) -> bool {
        self.purged || Instant::now() >= self.deadline
    }

    /// The report of `delivery`, or `None` if even a purge brought none.
    pub async fn report(
        &mut self,
        mut delivery: DeliveryFuture,
        producer: &Arc<FutureProducer<BrokerHealth>>,
    ) -> Option<Report> {
        if !self.purged {
            if let Ok(report) = tokio::time::timeout_at(self.deadline, &mut delivery).await {
                return Some(report);
            }
            self.purge(producer).await;
        }
        tokio::time::timeout_at(self.deadline, delivery).await.ok()
    }

    /// Fails what the producer still holds, and allows its reports
    /// [`PURGE_GRACE`] to arrive.
    async fn purge(&mut self, producer: &Arc<FutureProducer<BrokerHealth>>) {
        let producer = producer.clone();
        // The call blocks while the broker threads purge their queues.
        let _ = tokio::task::spawn_blocking(move || {
            producer.purge(PurgeConfig::default().queue().inflight());
        })
        .await;
        tracing::warn!("kafka deliveries outlived the delivery timeout; purged what was pending");
        self.purged = true;
        self.deadline = Instant::now() + PURGE_GRACE;
    }
}
