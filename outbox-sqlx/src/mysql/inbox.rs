//! [`MySqlInbox`]: the inbox on MySQL/MariaDB, in the consumer's own transaction.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{EventId, InboxStore, StoreError};
use sqlx::mysql::MySqlDatabaseError;
use sqlx::{MySql, Transaction};

use super::store::MySqlStore;
use crate::error::ResultExt;

/// MySQL's error number for a duplicate key.
const DUPLICATE_KEY: u16 = 1062;

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
        let now = self.store.now(&mut *conn).await?;
        let inserted = sqlx::query(&self.store.queries.inbox_claim)
            .bind(consumer)
            .bind(event_id.to_string())
            .bind(now)
            .execute(conn)
            .await;
        match inserted {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(e))
                if e.try_downcast_ref::<MySqlDatabaseError>()
                    .is_some_and(|m| m.number() == DUPLICATE_KEY) =>
            {
                Ok(false)
            }
            Err(e) => Err(e).store(),
        }
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
                self.store.sync_clock().await?;
                self.store.pool.begin().await.store()
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
                let mut conn = self.store.pool.acquire().await.store()?;
                let cutoff = self
                    .store
                    .now(&mut conn)
                    .await?
                    .saturating_sub(i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX));
                let done = sqlx::query(&self.store.queries.inbox_purge)
                    .bind(cutoff)
                    .bind(batch_size.min(i64::MAX as usize) as i64)
                    .execute(&mut *conn)
                    .await
                    .store()?;
                Ok(done.rows_affected())
            },
        )
        .await
    }
}
