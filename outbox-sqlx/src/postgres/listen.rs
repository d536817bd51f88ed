//! Wake-up through LISTEN/NOTIFY: a hint that ends an idle relay's wait.

use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use outbox_core::{StoreError, WakeUp};
use sqlx::postgres::PgListener;

use super::listen_hub::{HubSubscription, PgListenHub};
use super::store::PgStore;
use crate::error::ResultExt;

/// How often a relay that has just set `relay_waiting` looks at producers
/// whose insert read the flag just before (they send no NOTIFY): quickly
/// at first (most commit within milliseconds), then at a pace that costs
/// little while a producer keeps its transaction open.
fn watch_pause(watched_for: Duration, last: Duration) -> Duration {
    if watched_for < Duration::from_secs(1) {
        (last * 2).clamp(Duration::from_millis(1), Duration::from_millis(8))
    } else {
        Duration::from_millis(100)
    }
}

/// Listens on the store's channel; the insert trigger notifies it on commit
/// while a relay has said it waits (`relay_waiting`), so busy relays cost
/// producers no NOTIFY, and producers never take a lock for it.
///
/// Producers that inserted before the flag was set are watched until they
/// end (see `outbox_watch_producers`). A lost notification (listener
/// reconnecting, another relay's claim clearing the flag) costs at most
/// one poll interval: the relay's poll is
/// the backstop, and each idle poll sets the flag again.
pub struct PgWakeUp {
    notifications: Notifications,
    store: PgStore,
}

/// Where a wake-up's NOTIFYs come from.
enum Notifications {
    /// A LISTEN connection of its own.
    Own(PgListener),
    /// A connection shared with the other stores of its database.
    Shared(HubSubscription),
}

impl std::fmt::Debug for PgWakeUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgWakeUp").finish_non_exhaustive()
    }
}

impl PgStore {
    /// A wake-up source for one relay (it holds one connection of its own).
    pub async fn wake_up(&self) -> Result<PgWakeUp, StoreError> {
        let mut listener = PgListener::connect_with(self.pool()).await.store()?;
        listener.listen(self.channel()).await.store()?;
        Ok(self.wake_up_on(Notifications::Own(listener)))
    }

    /// A wake-up source for one relay that waits on `hub`'s connection,
    /// shared with the other stores of the database (the tenants of a
    /// fleet), instead of one of its own.
    pub async fn wake_up_shared(&self, hub: &PgListenHub) -> Result<PgWakeUp, StoreError> {
        let subscription = hub.subscribe(self.channel()).await?;
        Ok(self.wake_up_on(Notifications::Shared(subscription)))
    }

    fn wake_up_on(&self, notifications: Notifications) -> PgWakeUp {
        self.protocol
            .wake
            .listeners
            .fetch_add(1, AtomicOrdering::Relaxed);
        PgWakeUp {
            notifications,
            store: self.clone(),
        }
    }
}

impl Drop for PgWakeUp {
    /// A relay that stops while waiting would leave producers notifying
    /// until the next claim: clear the flag (best effort; another relay
    /// waiting sets it again at its next idle poll).
    fn drop(&mut self) {
        let protocol = &self.store.protocol;
        protocol
            .wake
            .listeners
            .fetch_sub(1, AtomicOrdering::Relaxed);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let protocol = protocol.clone();
            runtime.spawn(async move {
                if let Err(error) = protocol.stop_waiting().await {
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
        let wake = &self.store.protocol.wake;
        if wake.probed_idle.swap(false, AtomicOrdering::Relaxed) {
            return Ok((
                false,
                wake.registered_now.swap(false, AtomicOrdering::Relaxed),
            ));
        }
        let probe = self.store.protocol.probe().await?;
        wake.probed_idle.store(false, AtomicOrdering::Relaxed);
        wake.registered_now.store(false, AtomicOrdering::Relaxed);
        Ok((probe.anything, probe.registered))
    }

    /// Watches the producers that were mid-transaction when this relay set
    /// `relay_waiting` until they end: true once something is claimable (or
    /// a NOTIFY came), false when none is left and nothing is (then NOTIFY
    /// covers every later producer).
    async fn watched_producers_committed(&mut self) -> bool {
        let started = tokio::time::Instant::now();
        let mut watched: Option<Vec<String>> = None;
        let mut pause = Duration::ZERO;
        loop {
            let (in_flight, anything) = match self
                .store
                .protocol
                .watch_producers(watched.as_deref())
                .await
            {
                Ok(seen) => seen,
                Err(error) => {
                    tracing::warn!(%error, "could not watch producers; relying on polling");
                    return false;
                }
            };
            if anything {
                self.store
                    .protocol
                    .wake
                    .probed_idle
                    .store(false, AtomicOrdering::Relaxed);
                return true;
            }
            if in_flight.is_empty() {
                return false;
            }
            watched = Some(in_flight);
            pause = watch_pause(started.elapsed(), pause);
            tokio::select! {
                _ = self.notified() => return true,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    async fn notified(&mut self) {
        let listener = match &mut self.notifications {
            Notifications::Shared(subscription) => return subscription.notified().await,
            Notifications::Own(listener) => listener,
        };
        match listener.recv().await {
            Ok(_) => {
                // Older notifications buffered meanwhile say nothing new.
                while let Some(Ok(Some(_))) = listener.try_recv().now_or_never() {}
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
                self.store.protocol.expect_work();
                return;
            }
            Ok((false, registered_now)) => registered_now,
            Err(error) => {
                tracing::warn!(%error, "could not ask for NOTIFY; relying on polling");
                false
            }
        };
        if registered_now && self.watched_producers_committed().await {
            self.store.protocol.expect_work();
            return;
        }
        self.notified().await;
        self.store.protocol.expect_work();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watching_starts_fast_then_slows() {
        let mut pause = Duration::ZERO;
        let mut seen = Vec::new();
        for _ in 0..6 {
            pause = watch_pause(Duration::from_millis(10), pause);
            seen.push(pause.as_millis());
        }
        assert_eq!(seen, [1, 2, 4, 8, 8, 8]);
        assert_eq!(
            watch_pause(Duration::from_secs(2), pause),
            Duration::from_millis(100)
        );
    }
}
