//! Wake-up through LISTEN/NOTIFY: a hint that ends an idle relay's wait.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{StoreError, WakeUp};
use sqlx::postgres::PgListener;

use super::store::PgStore;
use crate::error::ResultExt;

/// Listens on the store's channel; the insert trigger notifies it on commit.
///
/// A lost notification (listener reconnecting) costs at most one poll
/// interval: the relay's poll is the backstop.
pub struct PgWakeUp {
    listener: PgListener,
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
        Ok(PgWakeUp { listener })
    }
}

#[async_trait]
impl WakeUp for PgWakeUp {
    async fn wait(&mut self) {
        if let Err(error) = self.listener.recv().await {
            // The listener reconnects on the next call; don't spin meanwhile.
            tracing::warn!(%error, "LISTEN connection lost; relying on polling");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
