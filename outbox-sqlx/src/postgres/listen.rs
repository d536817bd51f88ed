//! Wake-up through LISTEN/NOTIFY: a hint that ends an idle relay's wait.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use outbox_core::{StoreError, WakeUp};
use sqlx::postgres::PgListener;

use super::store::PgStore;
use crate::error::ResultExt;

/// After setting `relay_waiting`, look once more this much later: a
/// producer whose insert trigger read the flag just before it was set, and
/// whose commit came just after the look, sent no NOTIFY. Its commit was
/// already under way, so it is visible by then (or at the poll, at worst).
const LOOK_AGAIN_AFTER: Duration = Duration::from_millis(5);

/// Listens on the store's channel; the insert trigger notifies it on commit
/// while a relay has said it waits (`relay_waiting`), so busy relays cost
/// producers no NOTIFY, and producers never take a lock for it.
///
/// A lost notification (listener reconnecting, another relay's claim
/// clearing the flag) costs at most one poll interval: the relay's poll is
/// the backstop, and each idle poll sets the flag again.
pub struct PgWakeUp {
    listener: PgListener,
    store: PgStore,
}

impl std::fmt::Debug for PgWakeUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgWakeUp").finish_non_exhaustive()
    }
}

impl PgStore {
    /// A wake-up source for one relay (it holds one connection of its own).
    pub async fn wake_up(&self) -> Result<PgWakeUp, StoreError> {
        let mut listener = PgListener::connect_with(&self.pool).await.store()?;
        listener.listen(&self.queries.channel).await.store()?;
        self.wake.listeners.fetch_add(1, AtomicOrdering::Relaxed);
        Ok(PgWakeUp {
            listener,
            store: self.clone(),
        })
    }

    /// The next claim goes straight to its transaction: whoever calls this
    /// has just learnt there is something to claim.
    fn expect_work(&self) {
        self.idle.store(false, AtomicOrdering::Relaxed);
    }
}

impl Drop for PgWakeUp {
    /// A relay that stops while waiting would leave producers notifying
    /// until the next claim: clear the flag (best effort; another relay
    /// waiting sets it again at its next idle poll).
    fn drop(&mut self) {
        let store = &self.store;
        store.wake.listeners.fetch_sub(1, AtomicOrdering::Relaxed);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = store.clone();
            runtime.spawn(async move {
                let cleared = sqlx::query(&store.queries.stop_waiting)
                    .execute(&store.pool)
                    .await;
                if let Err(error) = cleared {
                    tracing::debug!(%error, "could not clear relay_waiting");
                }
            });
        }
    }
}

impl PgWakeUp {
    /// Whether there is work now; sets `relay_waiting` on the way (the idle
    /// probe of the claim that just found nothing may have done both).
    async fn registered_and_idle(&self) -> Result<(bool, bool), StoreError> {
        let wake = &self.store.wake;
        if wake.probed_idle.swap(false, AtomicOrdering::Relaxed) {
            return Ok((
                false,
                wake.registered_now.swap(false, AtomicOrdering::Relaxed),
            ));
        }
        let probe = self.store.probe().await?;
        wake.probed_idle.store(false, AtomicOrdering::Relaxed);
        wake.registered_now.store(false, AtomicOrdering::Relaxed);
        Ok((probe.anything, probe.registered))
    }

    async fn notified(&mut self) {
        match self.listener.recv().await {
            Ok(_) => {
                // Older notifications buffered meanwhile say nothing new.
                while let Some(Ok(Some(_))) = self.listener.try_recv().now_or_never() {}
            }
            Err(error) => {
                // The listener reconnects on the next call; don't spin meanwhile.
                tracing::warn!(%error, "LISTEN connection lost; relying on polling");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[async_trait]
impl WakeUp for PgWakeUp {
    async fn wait(&mut self) {
        let registered_now = match self.registered_and_idle().await {
            Ok((true, _)) => {
                self.store.expect_work();
                return;
            }
            Ok((false, registered_now)) => registered_now,
            Err(error) => {
                tracing::warn!(%error, "could not ask for NOTIFY; relying on polling");
                false
            }
        };
        if registered_now {
            tokio::select! {
                _ = self.notified() => {
                    self.store.expect_work();
                    return;
                }
                _ = tokio::time::sleep(LOOK_AGAIN_AFTER) => {}
            }
            if matches!(self.store.probe().await, Ok(probe) if probe.anything) {
                self.store
                    .wake
                    .probed_idle
                    .store(false, AtomicOrdering::Relaxed);
                self.store.expect_work();
                return;
            }
            self.store
                .wake
                .probed_idle
                .store(false, AtomicOrdering::Relaxed);
        }
        self.notified().await;
        self.store.expect_work();
    }
}
