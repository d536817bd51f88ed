//! What a running relay knows about itself, for a health endpoint in the
//! same process (the store's relay table says the same to other processes).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::PublisherOutage;

/// A handle on a relay's state, cloned from [`Relay::health`](super::Relay::health)
/// before the relay runs; cheap to read from any task.
#[derive(Clone, Debug, Default)]
pub struct RelayHealth {
    outage: Arc<Mutex<Option<OngoingOutage>>>,
}

/// A publisher outage the relay is paused for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OngoingOutage {
    /// Where and why.
    pub outage: PublisherOutage,
    /// When the relay first saw it.
    pub since: Instant,
}

impl OngoingOutage {
    /// How long it has lasted.
    pub fn duration(&self) -> Duration {
        self.since.elapsed()
    }
}

impl RelayHealth {
    /// The outage the relay is paused for, if any.
    pub fn outage(&self) -> Option<OngoingOutage> {
        self.lock().clone()
    }

    /// Records an outage batch; the first of a run sets `since`. Returns
    /// true when the outage began now.
    pub(super) fn outage_seen(&self, outage: PublisherOutage) -> bool {
        let mut current = self.lock();
        let began = current.is_none();
        let since = current.as_ref().map_or_else(Instant::now, |o| o.since);
        *current = Some(OngoingOutage { outage, since });
        began
    }

    /// Clears the outage; returns true if there was one.
    pub(super) fn outage_over(&self) -> bool {
        self.lock().take().is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<OngoingOutage>> {
        self.outage.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_outage_keeps_its_start_until_it_is_over() {
        let health = RelayHealth::default();
        assert!(health.outage().is_none());
        assert!(health.outage_seen(PublisherOutage::new("redis", "refused")));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!health.outage_seen(PublisherOutage::new("redis", "timed out")));
        let outage = health.outage().expect("in outage");
        assert_eq!(outage.outage.reason, "timed out");
        assert_eq!(outage.duration(), Duration::from_secs(5));
        assert!(health.outage_over());
        assert!(!health.outage_over());
        assert!(health.outage().is_none());
    }
}
