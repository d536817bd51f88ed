//! A client context that remembers when every broker was last down.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Remembers when librdkafka last reported "all brokers down" or a lost
/// broker connection. A delivery that times out within `window` of that
/// report is an outage. A success in
/// between does not clear it: reports arrive out of order around a cut (a
/// delivery acknowledged just before it, processed just after), and
/// clearing on them turned the cut's timeouts into burned attempts.
#[derive(Clone, Debug)]
pub struct BrokerHealth {
    started: Instant,
    /// Milliseconds after `started` of the last report, plus one (0: never).
    down_at: Arc<AtomicU64>,
}

impl Default for BrokerHealth {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            down_at: Arc::default(),
        }
    }
}

impl BrokerHealth {
    /// Whether every broker was reported down within the last `window`.
    pub(crate) fn down_within(&self, window: Duration) -> bool {
        let at = self.down_at.load(Ordering::Relaxed);
        if at == 0 {
            return false;
        }
        let reported = Duration::from_millis(at - 1);
        self.started.elapsed().saturating_sub(reported) <= window
    }

    pub(crate) fn report_down(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.down_at.store(now + 1, Ordering::Relaxed);
    }
}

impl ClientContext for BrokerHealth {
    fn error(&self, error: KafkaError, reason: &str) {
        // A lost connection counts too: a cut connection can come back
        // before librdkafka ever says "all brokers down", while the
        // messages it carried still time out.
        if matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::BrokerTransportFailure)
        ) {
            self.report_down();
        }
        tracing::warn!(%error, %reason, "librdkafka");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_down_report_holds_for_the_window_whatever_succeeds_meanwhile() {
        let health = BrokerHealth::default();
        assert!(!health.down_within(Duration::from_secs(60)));
        health.report_down();
        assert!(health.down_within(Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!health.down_within(Duration::from_millis(10)));
        assert!(health.down_within(Duration::from_secs(5)));
    }
}
