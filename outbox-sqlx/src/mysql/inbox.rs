//! [`MySqlInbox`]: the inbox on MySQL/MariaDB, in the consumer's own transaction.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{EventId, InboxStore, StoreError};
use sqlx::{MySql, Transaction};

use super::driver::Sqlx;
use super::store::MySqlStore;
use crate::error::ResultExt;

/// The inbox table of a [`MySqlStore`].
#[derive(Clone, Debug)]
pub struct MySqlInbox {
    store: MySqlStore,
}

impl MySqlStore {
    /// The inbox sharing this store's pool and names.
    pub fn inbox(&self) -> MySqlInbox {
        MySqlInbox {
            store: self.clone(),
        }
    }
}

impl MySqlInbox {
    /// Claims `(consumer, event_id)` on `conn` (inside your transaction).
    /// `true` means "apply the effect now". A duplicate is a plain insert
    /// failing on the primary key: MySQL undoes just that statement, and
    /// (unlike `INSERT IGNORE`) no other error is turned into a warning.
    pub async fn claim_in(
        &self,
        conn: &mut sqlx::MySqlConnection,
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
impl InboxStore for MySqlInbox {
    type Transaction = Transaction<'static, MySql>;

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
            self.store.protocol.inbox_purge(older_than, batch_size),
        )
        .await
    }
}
