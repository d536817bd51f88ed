//! Wake-up through LISTEN/NOTIFY: a hint that ends an idle relay's wait.

use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use outbox_core::{StoreError, WakeUp};
use sqlx::postgres::PgListener;

use super::store::PgStore;
use crate::error::ResultExt;

/// Listens on the store's channel; the insert trigger notifies it on commit
/// while a relay has said it waits (`relay_waiting`), so busy relays cost
/// producers no NOTIFY.
///
/// A lost notification (listener reconnecting, another relay's claim
/// clearing the flag) costs at most one poll interval: the relay's poll is
/// the backstop.
pub struct PgWakeUp {
    listener: PgListener,
    store: PgStore,
    /// This relay set the flag and has not been woken since.
    registered: bool,
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
        Ok(PgWakeUp {
            listener,
            store: self.clone(),
            registered: false,
        })
    }

    /// Sets `relay_waiting` once every enqueue that could have missed it has
    /// committed, then says whether anything is claimable already.
    async fn wait_for_notify(&self) -> Result<bool, StoreError> {
        sqlx::query(&self.queries.wait_for_notify)
            .execute(&self.pool)
            .await
            .store()?;
        sqlx::query_scalar(&self.queries.anything_to_do)
            .bind(self.config.clock.now())
            .fetch_one(&self.pool)
            .await
            .store()
    }

    /// The next claim goes straight to its transaction: whoever calls this
    /// has just learnt there is something to claim.
    fn expect_work(&self) {
        self.idle.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for PgWakeUp {
    /// A relay that stops while waiting would leave producers notifying
    /// until the next claim: clear the flag (best effort; another relay
    /// waiting then falls back to its poll until it asks again).
    fn drop(&mut self) {
        if !self.registered {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = self.store.clone();
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

#[async_trait]
impl WakeUp for PgWakeUp {
    async fn wait(&mut self) {
        if !self.registered {
            match self.store.wait_for_notify().await {
                Ok(anything) => {
                    self.registered = true;
                    if anything {
                        self.store.expect_work();
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "could not ask for NOTIFY; relying on polling")
                }
            }
        }
        match self.listener.recv().await {
            Ok(_) => {
                // The claim that follows clears the flag; older notifications
                // buffered meanwhile say nothing new.
                self.registered = false;
                self.store.expect_work();
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
