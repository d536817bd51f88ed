//! [`SqliteInbox`]: the inbox on SQLite, in the consumer's own transaction.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{EventId, InboxStore, StoreError};
use sqlx::{Sqlite, Transaction};

use super::row::micros;
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
        let done = sqlx::query(&self.store.queries.inbox_claim)
            .bind(consumer)
            .bind(event_id.to_string())
            .bind(micros(self.store.config.clock.now()))
            .execute(conn)
            .await
            .store()?;
        Ok(done.rows_affected() == 1)
    }
}

#[async_trait]
impl InboxStore for SqliteInbox {
    type Transaction = Transaction<'static, Sqlite>;

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        self.store.begin_immediate().await
    }

    async fn claim(
        &self,
        tx: &mut Self::Transaction,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        self.claim_in(tx, consumer, event_id).await
    }

    async fn commit(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        tx.commit().await.store()
    }

    async fn rollback(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        tx.rollback().await.store()
    }

    async fn purge_older_than(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        let cutoff = self.store.config.clock.now()
            - chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
        let done = sqlx::query(&self.store.queries.inbox_purge)
            .bind(micros(cutoff))
            .bind(batch_size.min(i64::MAX as usize) as i64)
            .execute(&self.store.pool)
            .await
            .store()?;
        Ok(done.rows_affected())
    }
}
