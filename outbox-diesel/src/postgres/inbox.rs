//! [`PgInbox`]: the inbox on PostgreSQL through diesel-async. Its
//! transaction owns a pooled connection with a transaction open: write the
//! effect through it with Diesel (`&mut *tx` is an `AsyncPgConnection`), and
//! it commits with the claim or not at all.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use async_trait::async_trait;
use diesel_async::pooled_connection::deadpool::Object;
use diesel_async::{AnsiTransactionManager, AsyncPgConnection, TransactionManager};
use outbox_core::{EventId, InboxStore, StoreError};

use super::driver::Diesel;
use super::store::PgStore;
use crate::Effect;
use crate::error::ResultExt;

/// The inbox table of a [`PgStore`].
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

/// A pooled connection inside an open transaction (Diesel's transaction
/// manager knows it: a `conn.transaction(...)` inside it is a savepoint).
pub struct PgInboxTx {
    conn: Object<AsyncPgConnection>,
}

impl Deref for PgInboxTx {
    type Target = AsyncPgConnection;
    fn deref(&self) -> &AsyncPgConnection {
        &self.conn
    }
}

impl DerefMut for PgInboxTx {
    fn deref_mut(&mut self) -> &mut AsyncPgConnection {
        &mut self.conn
    }
}

impl PgInbox {
    /// Claims `(consumer, event_id)` on `conn` (inside your transaction),
    /// for callers who manage their own. `true` means "apply the effect now".
    pub async fn claim_in(
        &self,
        conn: &mut AsyncPgConnection,
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
    ///
    /// ```ignore
    /// let booked = inbox
    ///     .apply_once("revenue", event_id, async |conn| {
    ///         diesel::insert_into(revenue::table).values(&row).execute(conn).await?;
    ///         Ok::<_, outbox_diesel::Error>(())
    ///     })
    ///     .await?;
    /// ```
    pub async fn apply_once<R, E, F>(
        &self,
        consumer: &str,
        event_id: EventId,
        effect: F,
    ) -> Result<Option<R>, E>
    where
        for<'r> F: AsyncFnOnce(&'r mut AsyncPgConnection) -> Result<R, E>
            + Effect<&'r mut AsyncPgConnection, Result<R, E>, Fut: Send>
            + Send,
        E: From<diesel::result::Error> + From<StoreError> + Send,
        R: Send,
    {
        use diesel_async::AsyncConnection;
        let mut conn = self.store.conn().await?;
        self.store.sync_clock(&mut conn).await?;
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
impl InboxStore for PgInbox {
    type Transaction = PgInboxTx;

    async fn begin(&self) -> Result<PgInboxTx, StoreError> {
        let begun = async {
            let mut conn = self.store.conn().await?;
            self.store.sync_clock(&mut conn).await?;
            AnsiTransactionManager::begin_transaction(&mut *conn)
                .await
                .store()?;
            Ok(PgInboxTx { conn })
        };
        begun
            .await
            .map_err(|e: StoreError| e.during("inbox begin", self.table()))
    }

    async fn claim(
        &self,
        tx: &mut PgInboxTx,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        // A concurrent claim of the same key waits on the primary key until
        // the first commits, then finds the row and inserts nothing.
        self.claim_in(tx, consumer, event_id)
            .await
            .map_err(|e| e.during("inbox claim", self.table()))
    }

    async fn commit(&self, mut tx: PgInboxTx) -> Result<(), StoreError> {
        AnsiTransactionManager::commit_transaction(&mut *tx.conn)
            .await
            .store()
            .map_err(|e| e.during("inbox commit", self.table()))
    }

    async fn rollback(&self, mut tx: PgInboxTx) -> Result<(), StoreError> {
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
    }
}
