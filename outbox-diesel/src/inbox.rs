//! [`DieselInbox`]: the inbox of a diesel-async store, written once for
//! both dialects. Its transaction ([`DieselInboxTx`]) owns a pooled
//! connection with a transaction open: write the effect through it with
//! Diesel (`&mut *tx` is the dialect's async connection), and it commits
//! with the claim or not at all. Each store says how it hands out a
//! connection, writes a claim and purges old claims ([`InboxDialect`]).

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use async_trait::async_trait;
use diesel_async::{AnsiTransactionManager, AsyncConnection, TransactionManager};
use outbox_core::{EventId, InboxStore, StoreError};

use crate::Effect;
use crate::error::ResultExt;

/// What a store of this crate gives its inbox. Implemented by
/// `postgres::PgStore` and `mysql::MysqlStore`.
#[async_trait]
pub trait InboxDialect: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The dialect's async connection.
    type Connection: AsyncConnection<TransactionManager = AnsiTransactionManager> + Send + 'static;
    /// A connection of its pool (returned to the pool when dropped).
    type Pooled: DerefMut<Target = Self::Connection> + Send + 'static;

    /// The inbox table's name (for errors).
    fn inbox_table(&self) -> String;

    /// A pooled connection, store time synced on it, no transaction open.
    async fn inbox_connection(&self) -> Result<Self::Pooled, StoreError>;

    /// Writes the claim of `(consumer, event_id)` on `conn`, inside the
    /// caller's transaction: `true` when it is new.
    async fn claim_on(
        &self,
        conn: &mut Self::Connection,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError>;

    /// Deletes claims older than `older_than` of store time, at most
    /// `batch_size`; returns how many.
    async fn purge_inbox(&self, older_than: Duration, batch_size: usize)
    -> Result<u64, StoreError>;
}

/// [`InboxDialect`] for a store whose `protocol` (an `outbox_sql`
/// protocol over this crate's `Diesel` driver) holds the inbox statements,
/// and whose `synced_conn()` hands out a pooled connection with store time
/// synced.
macro_rules! protocol_inbox {
    ($store:ty, $connection:ty) => {
        outbox_sql::protocol_inbox_dialect! {
            $store: $crate::inbox::InboxDialect {
                type Connection = $connection;
                type Pooled = diesel_async::pooled_connection::deadpool::Object<$connection>;

                async fn inbox_connection(&self) -> Result<Self::Pooled, outbox_core::StoreError> {
                    self.synced_conn().await
                }
            }
            claims on $connection as |conn| super::driver::Diesel(conn)
        }
    };
}
pub(crate) use protocol_inbox;

/// The inbox table of a store, sharing its pool and names (the store's
/// `inbox()`).
#[derive(Clone, Debug)]
pub struct DieselInbox<S> {
    store: S,
}

/// A pooled connection inside an open transaction (Diesel's transaction
/// manager knows it: a `conn.transaction(...)` inside it is a savepoint).
pub struct DieselInboxTx<P> {
    conn: P,
}

impl<P: Deref> Deref for DieselInboxTx<P> {
    type Target = P::Target;
    fn deref(&self) -> &P::Target {
        &self.conn
    }
}

impl<P: DerefMut> DerefMut for DieselInboxTx<P> {
    fn deref_mut(&mut self) -> &mut P::Target {
        &mut self.conn
    }
}

impl<S: InboxDialect> DieselInbox<S> {
    pub(crate) fn of(store: S) -> Self {
        Self { store }
    }

    /// Claims `(consumer, event_id)` on `conn` (inside your transaction),
    /// for callers who manage their own. `true` means "apply the effect now".
    pub async fn claim_in(
        &self,
        conn: &mut S::Connection,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        self.store.claim_on(conn, consumer, event_id).await
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
        for<'r> F: AsyncFnOnce(&'r mut S::Connection) -> Result<R, E>
            + Effect<&'r mut S::Connection, Result<R, E>, Fut: Send>
            + Send,
        E: From<diesel::result::Error> + From<StoreError> + Send,
        R: Send,
    {
        let mut conn = self.store.inbox_connection().await?;
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
impl<S: InboxDialect> InboxStore for DieselInbox<S> {
    type Transaction = DieselInboxTx<S::Pooled>;

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        let begun = async {
            let mut conn = self.store.inbox_connection().await?;
            AnsiTransactionManager::begin_transaction(&mut *conn)
                .await
                .store()?;
            Ok(DieselInboxTx { conn })
        };
        begun
            .await
            .map_err(|e: StoreError| e.during("inbox begin", self.store.inbox_table()))
    }

    async fn claim(
        &self,
        tx: &mut Self::Transaction,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        self.claim_in(tx, consumer, event_id)
            .await
            .map_err(|e| e.during("inbox claim", self.store.inbox_table()))
    }

    async fn commit(&self, mut tx: Self::Transaction) -> Result<(), StoreError> {
        AnsiTransactionManager::commit_transaction(&mut *tx.conn)
            .await
            .store()
            .map_err(|e| e.during("inbox commit", self.store.inbox_table()))
    }

    async fn rollback(&self, mut tx: Self::Transaction) -> Result<(), StoreError> {
        AnsiTransactionManager::rollback_transaction(&mut *tx.conn)
            .await
            .store()
            .map_err(|e| e.during("inbox rollback", self.store.inbox_table()))
    }

    async fn purge_older_than(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        // The protocol's purge names itself (it also runs for the CLI).
        self.store.purge_inbox(older_than, batch_size).await
    }
}
