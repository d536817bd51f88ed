//! Several relays over one store and publisher, as the end-to-end tests of
//! every adapter run them.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::publisher::Publisher;
use crate::relay::{Relay, RelayConfig, RelayError, RelayReport};
use crate::store::OutboxStore;

use super::relay_suite;

/// Relays `{name}-0`, `{name}-1`, … sharing one shutdown token, each on a
/// task of its own with the suites' fast settings
/// ([`relay_suite::config`]).
pub struct RelayFleet {
    shutdown: CancellationToken,
    handles: Vec<JoinHandle<Result<RelayReport, RelayError>>>,
}

impl RelayFleet {
    /// Starts `n` relays with the suites' settings.
    pub fn spawn<S, P>(store: Arc<S>, publisher: Arc<P>, name: &str, n: usize) -> Self
    where
        S: OutboxStore + ?Sized + 'static,
        P: Publisher + ?Sized + 'static,
    {
        Self::spawn_with(store, publisher, name, n, |_| {})
    }

    /// Starts `n` relays whose settings `configure` adjusts first.
    pub fn spawn_with<S, P>(
        store: Arc<S>,
        publisher: Arc<P>,
        name: &str,
        n: usize,
        configure: impl Fn(&mut RelayConfig),
    ) -> Self
    where
        S: OutboxStore + ?Sized + 'static,
        P: Publisher + ?Sized + 'static,
    {
        let shutdown = CancellationToken::new();
        let handles = (0..n)
            .map(|r| {
                let mut config = relay_suite::config(&format!("{name}-{r}"));
                configure(&mut config);
                Relay::new(store.clone(), publisher.clone(), config)
                    .expect("valid relay settings")
                    .spawn(shutdown.clone())
            })
            .collect();
        Self { shutdown, handles }
    }

    /// Shuts every relay down gracefully and adds up their reports. Panics
    /// if one does not stop within `limit`, stopped with an error, or
    /// panicked.
    pub async fn stop(self, limit: Duration) -> RelayReport {
        self.shutdown.cancel();
        self.join(limit).await
    }

    /// Kills every relay as SIGKILL would (tasks aborted wherever they
    /// are): nothing is released or settled; their leases expire.
    pub async fn kill(self) {
        for handle in self.handles {
            handle.abort();
            let _ = handle.await;
        }
    }

    /// Waits for every relay to end without asking them to (they were
    /// killed, or stop on their own); adds up their reports as
    /// [`stop`](Self::stop) does.
    pub async fn join(self, limit: Duration) -> RelayReport {
        let mut total = RelayReport {
            drained: true,
            ..RelayReport::default()
        };
        for handle in self.handles {
            let report = tokio::time::timeout(limit, handle)
                .await
                .unwrap_or_else(|_| panic!("a relay did not stop within {limit:?}"))
                .expect("the relay task panicked")
                .unwrap_or_else(|e| panic!("a relay stopped with an error: {e}"));
            total += &report;
        }
        total
    }
}
