//! [`PgInbox`]: the inbox on PostgreSQL, in the consumer's own transaction.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{EventId, InboxStore, StoreError};
use sqlx::{Postgres, Transaction};

use super::driver::Sqlx;
use super::store::PgStore;
use crate::error::ResultExt;

/// The inbox table of a [`PgStore`]. The transaction is a plain
/// `sqlx::Transaction`: write your effect through it, then commit.
#[derive(Clone, Debug)]
pub struct PgInbox {
    store: PgStore,
}

impl PgStore {
    /// The inbox sharing this store's pool and names.
    pub fn inbox(&self) -> PgInbox {
        PgInbox {
            store: self.clone(),
        }
    }
}

impl PgInbox {
    /// Claims `(consumer, event_id)` on `conn` (inside your transaction),
    /// for callers who manage their own. `true` means "apply the effect now".
    pub async fn claim_in(
        &self,
        conn: &mut sqlx::PgConnection,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        self.store
            .protocol
            .inbox_claim(&mut Sqlx(conn), consumer, event_id)
            .await
    }
}

#[async_trait]
impl InboxStore for PgInbox {
    type Transaction = Transaction<'static, Postgres>;

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        crate::error::during(
            "inbox begin",
            || self.store.config().tables.inbox(),
            async move {
                self.store.protocol.sync_clock().await?;
                crate::pool::begin(self.store.pool()).await
            },
        )
        .await
    }

    async fn claim(
        &self,
        tx: &mut Self::Transaction,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        crate::error::during(
            "inbox claim",
            || self.store.config().tables.inbox(),
            async move {
                // A concurrent claim of the same key waits on the primary key until
                // the first commits, then finds the row and inserts nothing.
                self.claim_in(tx, consumer, event_id).await
            },
        )
        .await
    }

    async fn commit(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        crate::error::during(
            "inbox commit",
            || self.store.config().tables.inbox(),
            async move { tx.commit().await.store() },
        )
        .await
    }

    async fn rollback(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        crate::error::during(
            "inbox rollback",
            || self.store.config().tables.inbox(),
            async move { tx.rollback().await.store() },
        )
        .await
    }

    async fn purge_older_than(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        self.store
            .protocol
            .inbox_purge(older_than, batch_size)
            .await
    }
}
