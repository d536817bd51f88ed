//! [`SqliteInbox`]: the inbox on SQLite, in the consumer's own transaction.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{EventId, InboxStore, StoreError};
use sqlx::{Sqlite, Transaction};

use super::store::SqliteStore;
use crate::error::ResultExt;

/// The inbox table of a [`SqliteStore`]. Its transactions begin `IMMEDIATE`
/// so the claim and your effect never meet a stale snapshot.
#[derive(Clone, Debug)]
pub struct SqliteInbox {
    store: SqliteStore,
}

impl SqliteStore {
    /// The inbox sharing this store's pool and names.
    pub fn inbox(&self) -> SqliteInbox {
        SqliteInbox {
            store: self.clone(),
        }
    }
}

impl SqliteInbox {
    /// Claims `(consumer, event_id)` on `conn` (inside your transaction).
    /// `true` means "apply the effect now".
    pub async fn claim_in(
        &self,
        conn: &mut sqlx::SqliteConnection,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        let now = self.store.now(&mut *conn).await?;
        let done = sqlx::query(&self.store.queries.inbox_claim)
            .bind(consumer)
            .bind(event_id.to_string())
            .bind(now)
            .execute(&mut *conn)
            .await
            .store()?;
        Ok(done.rows_affected() == 1)
    }
}

#[async_trait]
impl InboxStore for SqliteInbox {
    type Transaction = Transaction<'static, Sqlite>;

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        crate::error::during(
            "inbox begin",
            || self.store.config().tables.inbox(),
            async move {
                // Before the write lock is taken: syncing the test clock writes.
                self.store.sync_clock().await?;
                self.store.begin_immediate().await
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
            async move { self.claim_in(tx, consumer, event_id).await },
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
        crate::error::during(
            "inbox purge_older_than",
            || self.store.config().tables.inbox(),
            async move {
                self.store.sync_clock().await?;
                let mut tx = self.store.begin_immediate().await?;
                let cutoff = self
                    .store
                    .now(&mut tx)
                    .await?
                    .saturating_sub(i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX));
                let done = sqlx::query(&self.store.queries.inbox_purge)
                    .bind(cutoff)
                    .bind(batch_size.min(i64::MAX as usize) as i64)
                    .execute(&mut *tx)
                    .await
                    .store()?;
                tx.commit().await.store()?;
                Ok(done.rows_affected())
            },
        )
        .await
    }
}
