//! [`SqliteInbox`]: the inbox on SQLite, in the consumer's own transaction.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{EventId, StoreError};
use sqlx::{Sqlite, Transaction};

use super::driver::Sqlx;
use super::store::SqliteStore;
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
        self.protocol
            .inbox_claim(&mut Sqlx(conn), consumer, event_id)
            .await
    }

    async fn purge_inbox(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        self.protocol.inbox_purge(older_than, batch_size).await
    }
}
