//! A client context that tracks whether every broker is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Remembers librdkafka's global "all brokers down" state until a delivery
/// succeeds again.
#[derive(Clone, Debug, Default)]
pub struct BrokerHealth {
    down: Arc<AtomicBool>,
}

impl BrokerHealth {
    pub(crate) fn all_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    pub(crate) fn delivered(&self) {
        self.down.store(false, Ordering::Relaxed);
    }
}

impl ClientContext for BrokerHealth {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            self.down.store(true, Ordering::Relaxed);
        }
        tracing::warn!(%error, %reason, "librdkafka");
    }
}
