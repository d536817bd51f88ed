//! [`SqlxInbox`]: the inbox of an sqlx store, in the consumer's own
//! transaction, written once for every dialect. Each store says how its
//! inbox transaction begins, how a claim is written on a connection and how
//! old claims are purged ([`InboxDialect`]); naming the operation and table
//! in errors and ending the transaction are the same everywhere.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{EventId, InboxStore, StoreError};
use sqlx::{Database, Transaction};

use crate::error::{ResultExt, during};

/// What a store of this crate gives its inbox. Implemented by
/// [`PgStore`](crate::postgres::PgStore),
/// [`MySqlStore`](crate::mysql::MySqlStore) and
/// [`SqliteStore`](crate::sqlite::SqliteStore).
#[async_trait]
pub trait InboxDialect: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The sqlx database the store runs on.
    type Database: Database;

    /// The inbox table's name (for errors).
    fn inbox_table(&self) -> String;

    /// Begins the consumer's transaction.
    async fn begin_inbox(&self) -> Result<Transaction<'static, Self::Database>, StoreError>;

    /// Writes the claim of `(consumer, event_id)` on `conn`, inside the
    /// caller's transaction: `true` when it is new.
    async fn claim_on(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError>;

    /// Deletes claims older than `older_than` of store time, at most
    /// `batch_size`; returns how many.
    async fn purge_inbox(&self, older_than: Duration, batch_size: usize)
    -> Result<u64, StoreError>;
}

/// [`InboxDialect`] for a store whose `protocol` (an `outbox_sql`
/// protocol over this crate's `Sqlx` driver) holds the inbox statements:
/// every store of this crate. The transaction begins as `begin` says (by
/// default: the clock synced, then a plain transaction from the pool).
macro_rules! protocol_inbox {
    ($store:ty, $database:ty, $connection:ty) => {
        $crate::inbox::protocol_inbox!($store, $database, $connection, |store| {
            store.protocol.sync_clock().await?;
            $crate::pool::begin(store.pool()).await
        });
    };
    ($store:ty, $database:ty, $connection:ty, |$this:ident| $begin:block) => {
        outbox_sql::protocol_inbox_dialect! {
            $store: $crate::inbox::InboxDialect {
                type Database = $database;

                async fn begin_inbox(
                    &self,
                ) -> Result<sqlx::Transaction<'static, $database>, outbox_core::StoreError> {
                    let $this = self;
                    $begin
                }
            }
            claims on $connection as |conn| super::driver::Sqlx::caller(conn)
        }
    };
}
pub(crate) use protocol_inbox;

/// The inbox table of a store, sharing its pool and names (the store's
/// `inbox()`). The transaction is a plain `sqlx::Transaction`: write your
/// effect through it, then commit.
#[derive(Clone, Debug)]
pub struct SqlxInbox<S> {
    store: S,
}

impl<S: InboxDialect> SqlxInbox<S> {
    pub(crate) fn of(store: S) -> Self {
        Self { store }
    }

    /// Claims `(consumer, event_id)` on `conn` (inside your transaction),
    /// for callers who manage their own. `true` means "apply the effect now".
    pub async fn claim_in(
        &self,
        conn: &mut <S::Database as Database>::Connection,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        self.store.claim_on(conn, consumer, event_id).await
    }
}

#[async_trait]
impl<S: InboxDialect> InboxStore for SqlxInbox<S> {
    type Transaction = Transaction<'static, S::Database>;

    async fn begin(&self) -> Result<Self::Transaction, StoreError> {
        during(
            "inbox begin",
            || self.store.inbox_table(),
            self.store.begin_inbox(),
        )
        .await
    }

    async fn claim(
        &self,
        tx: &mut Self::Transaction,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        during(
            "inbox claim",
            || self.store.inbox_table(),
            self.claim_in(tx, consumer, event_id),
        )
        .await
    }

    async fn commit(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        during("inbox commit", || self.store.inbox_table(), async move {
            tx.commit().await.store()
        })
        .await
    }

    async fn rollback(&self, tx: Self::Transaction) -> Result<(), StoreError> {
        during("inbox rollback", || self.store.inbox_table(), async move {
            tx.rollback().await.store()
        })
        .await
    }

    async fn purge_older_than(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        // Each store names the operation itself (its protocol's purge runs
        // outside this inbox too: the CLI, the daemon).
        self.store.purge_inbox(older_than, batch_size).await
    }
}
