//! [`SqliteInbox`]: the inbox on SQLite, in the consumer's own transaction.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{EventId, StoreError};
use sqlx::{Sqlite, Transaction};

use super::store::SqliteStore;
use crate::error::ResultExt;
use crate::inbox::{InboxDialect, SqlxInbox};

/// The inbox table of a [`SqliteStore`]. Its transactions begin `IMMEDIATE`
/// so the claim and your effect never meet a stale snapshot.
pub type SqliteInbox = SqlxInbox<SqliteStore>;

impl SqliteStore {
    /// The inbox sharing this store's pool and names.
    pub fn inbox(&self) -> SqliteInbox {
        SqlxInbox::of(self.clone())
    }
}

#[async_trait]
impl InboxDialect for SqliteStore {
    type Database = Sqlite;

    fn inbox_table(&self) -> String {
        self.config().tables.inbox()
    }

    async fn begin_inbox(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        // Before the write lock is taken: syncing the test clock writes.
        self.sync_clock().await?;
        self.begin_immediate().await
    }

    async fn claim_on(
        &self,
        conn: &mut sqlx::SqliteConnection,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        let now = self.now(&mut *conn).await?;
        let done = sqlx::query(&self.queries.inbox_claim)
            .bind(consumer)
            .bind(event_id.to_string())
            .bind(now)
            .execute(&mut *conn)
            .await
            .store()?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge_inbox(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        crate::error::during(
            "inbox purge_older_than",
            || self.inbox_table(),
            async move {
                self.sync_clock().await?;
                let mut tx = self.begin_immediate().await?;
                let cutoff = self
                    .now(&mut tx)
                    .await?
                    .saturating_sub(i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX));
                let done = sqlx::query(&self.queries.inbox_purge)
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
