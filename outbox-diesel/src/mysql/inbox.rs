//! [`MysqlInbox`]: the inbox on MySQL/MariaDB through diesel-async. Its
//! transaction owns a pooled connection with a transaction open: write the
//! effect through it with Diesel (`&mut *tx` is an `AsyncMysqlConnection`),
//! and it commits with the claim or not at all.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use async_trait::async_trait;
use diesel_async::pooled_connection::deadpool::Object;
use diesel_async::{AnsiTransactionManager, AsyncMysqlConnection, TransactionManager};
use outbox_core::{EventId, InboxStore, StoreError};

use super::driver::Diesel;
use super::store::MysqlStore;
use crate::Effect;
use crate::error::ResultExt;

/// The inbox table of a [`MysqlStore`].
#[derive(Clone, Debug)]
pub struct MysqlInbox {
    store: MysqlStore,
}

impl MysqlStore {
    /// The inbox sharing this store's pool and names.
    pub fn inbox(&self) -> MysqlInbox {
        MysqlInbox {
            store: self.clone(),
        }
    }
}

/// A pooled connection inside an open transaction (Diesel's transaction
/// manager knows it: a `conn.transaction(...)` inside it is a savepoint).
pub struct MysqlInboxTx {
    conn: Object<AsyncMysqlConnection>,
}

impl Deref for MysqlInboxTx {
    type Target = AsyncMysqlConnection;
    fn deref(&self) -> &AsyncMysqlConnection {
        &self.conn
    }
}

impl DerefMut for MysqlInboxTx {
    fn deref_mut(&mut self) -> &mut AsyncMysqlConnection {
        &mut self.conn
    }
}

impl MysqlInbox {
    /// Claims `(consumer, event_id)` on `conn` (inside your transaction),
    /// for callers who manage their own. `true` means "apply the effect
    /// now". A duplicate is a plain insert failing on the primary key:
    /// MySQL undoes just that statement, and your transaction goes on.
    pub async fn claim_in(
        &self,
        conn: &mut AsyncMysqlConnection,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        self.store
            .protocol
            .inbox_claim(&mut Diesel(conn), consumer, event_id)
            .await
    }

    fn table(&self) -> String {
        self.store.config().tables.inbox()
    }

    /// Applies `effect` once for `consumer`, in Diesel's closure style: in
    /// one transaction the claim is written and, if it is new, `effect` runs
    /// on the same connection; both commit or neither does. `Ok(None)` is a
    /// redelivery (nothing ran); an error from `effect` rolls the claim
    /// back, so a later delivery tries again.
    pub async fn apply_once<R, E, F>(
        &self,
        consumer: &str,
        event_id: EventId,
        effect: F,
    ) -> Result<Option<R>, E>
    where
        for<'r> F: AsyncFnOnce(&'r mut AsyncMysqlConnection) -> Result<R, E>
            + Effect<&'r mut AsyncMysqlConnection, Result<R, E>, Fut: Send>
            + Send,
        E: From<diesel::result::Error> + From<StoreError> + Send,
        R: Send,
    {
        use diesel_async::AsyncConnection;
        self.store.protocol.sync_clock().await?;
        let mut conn = self.store.conn().await?;
        conn.transaction::<_, E, _>(async |conn| {
            if !self.claim_in(conn, consumer, event_id).await? {
                return Ok(None);
            }
            Ok(Some(effect(conn).await?))
        })
        .await
    }
}

#[async_trait]
impl InboxStore for MysqlInbox {
    type Transaction = MysqlInboxTx;

    async fn begin(&self) -> Result<MysqlInboxTx, StoreError> {
        let begun = async {
            self.store.protocol.sync_clock().await?;
            let mut conn = self.store.conn().await?;
            AnsiTransactionManager::begin_transaction(&mut *conn)
                .await
                .store()?;
            Ok(MysqlInboxTx { conn })
        };
        begun
            .await
            .map_err(|e: StoreError| e.during("inbox begin", self.table()))
    }

    async fn claim(
        &self,
        tx: &mut MysqlInboxTx,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        // A concurrent claim of the same key waits on the primary key until
        // the first commits, then fails as a duplicate.
        self.claim_in(tx, consumer, event_id)
            .await
            .map_err(|e| e.during("inbox claim", self.table()))
    }

    async fn commit(&self, mut tx: MysqlInboxTx) -> Result<(), StoreError> {
        AnsiTransactionManager::commit_transaction(&mut *tx.conn)
            .await
            .store()
            .map_err(|e| e.during("inbox commit", self.table()))
    }

    async fn rollback(&self, mut tx: MysqlInboxTx) -> Result<(), StoreError> {
        AnsiTransactionManager::rollback_transaction(&mut *tx.conn)
            .await
            .store()
            .map_err(|e| e.during("inbox rollback", self.table()))
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
            .map_err(|e| e.during("inbox purge", self.table()))
    }
}
