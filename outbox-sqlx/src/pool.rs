//! A pool guard against transactions left open by cancelled futures.

use sqlx::pool::PoolOptions;
use sqlx::{Connection, Database};

/// Adds a `before_acquire` check that discards any pooled connection still
/// inside a transaction.
///
/// A future dropped between sending `BEGIN` and building its `Transaction`
/// guard (a task aborted or timed out at that instant, as a relay's
/// drain timeout may do) returns its connection to the pool mid-transaction.
/// Reused, that connection would turn the next caller's `BEGIN … COMMIT`
/// into a savepoint that never commits, and on SQLite would hold the write
/// lock for good. Build every pool a store or relay uses with this guard.
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
