//! Guards against transactions left open by cancelled futures.

use sqlx::pool::PoolOptions;
use sqlx::{Connection, Database};

/// Runs `begin` (one of sqlx's `begin`s, with whatever precedes it on
/// the same connection) on a task of its own, so that a cancelled caller
/// cannot cut it in half.
///
/// sqlx 0.8.6 raises a MySQL or PostgreSQL connection's transaction depth
/// only once `BEGIN`'s answer is read. A future dropped in between (an
/// aborted task, a `select!`, a relay's drain timeout) leaves the server
/// inside a transaction that nothing ends: the `Transaction` guard rolls
/// back only at depth > 0, the pool's release ping only drains the answer,
/// and the pool hands the connection on. Its next borrower's autocommit
/// statements then run inside that transaction and keep their locks (on
/// MySQL the store's clock row, so every claim waited out its lock timeout);
/// on a pool the application shares, its writes would vanish with it.
/// On a task of its own, `BEGIN` always completes: a caller gone by then
/// drops a whole `Transaction`, whose guard rolls back before the connection
/// returns to the pool. (SQLite's worker already undoes an unanswered
/// `BEGIN`.)
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn begin_to_completion<DB, F>(
    begin: F,
) -> Result<sqlx::Transaction<'static, DB>, outbox_core::StoreError>
where
    DB: Database,
    F: Future<Output = Result<sqlx::Transaction<'static, DB>, sqlx::Error>> + Send + 'static,
{
    match tokio::spawn(begin).await {
        Ok(begun) => crate::error::ResultExt::store(begun),
        // The runtime is shutting down (or sqlx panicked): nothing to retry here.
        Err(join) => Err(outbox_core::StoreError::Unavailable(Box::new(join))),
    }
}

/// `pool.begin()`, run to completion (see [`begin_to_completion`]).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn begin<DB: Database>(
    pool: &sqlx::Pool<DB>,
) -> Result<sqlx::Transaction<'static, DB>, outbox_core::StoreError> {
    let pool = pool.clone();
    begin_to_completion(async move { pool.begin().await }).await
}

/// Adds a `before_acquire` check that discards any pooled connection sqlx
/// still counts as inside a transaction.
///
/// That covers what sqlx tracks (a `Transaction` begun on a borrowed pooled connection
/// and leaked, a SQLite `BEGIN` whose caller went away);
/// the stores' own transactions are also begun cancellation-safe (see
/// `begin` in this module), which this check cannot see: sqlx does not
/// track a `BEGIN` whose answer was never read. Build every pool a store or
/// relay uses with this guard.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # {
/// use outbox_sqlx::guard_cancelled_transactions;
/// let options = guard_cancelled_transactions(sqlx::sqlite::SqlitePoolOptions::new());
/// # }
/// ```
pub fn guard_cancelled_transactions<DB: Database>(options: PoolOptions<DB>) -> PoolOptions<DB> {
    options.before_acquire(|conn, _meta| {
        Box::pin(async move {
            let leaked = conn.is_in_transaction();
            if leaked {
                tracing::warn!("discarding a pooled connection left inside a transaction");
            }
            Ok(!leaked)
        })
    })
}
