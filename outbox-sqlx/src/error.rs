//! Maps sqlx errors onto the core's error, deciding retryability.

use outbox_core::StoreError;

/// Classifies a driver error: connection trouble, pool timeouts,
/// serialization failures and deadlocks are retryable; the rest is not.
pub(crate) fn store_error(error: sqlx::Error) -> StoreError {
    match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => StoreError::Unavailable(Box::new(error)),
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            if is_conflict(&code) {
                StoreError::Conflict(db.message().to_owned())
            } else if is_not_migrated(&code, db.message()) {
                StoreError::Config(format!(
                    "the outbox tables are missing or older than this version ({}): \
                     run migrate() (or `outbox migrate`) on this database and schema",
                    db.message()
                ))
            } else if is_unavailable(&code) {
                StoreError::Unavailable(Box::new(error))
            } else {
                StoreError::fatal(error)
            }
        }
        _ => StoreError::fatal(error),
    }
}

/// Serialization failure / deadlock in PostgreSQL, MySQL and SQLite.
fn is_conflict(code: &str) -> bool {
    matches!(
        code,
        "40001" | "40P01" | "1213" | "1205" | "5" | "6" | "517" | "261" | "262"
    )
}

/// A table, function or schema of the outbox missing: PostgreSQL's
/// undefined table, function or schema; MySQL's no such table (1146,
/// SQLSTATE 42S02); SQLite's
/// "no such table" (its code is the generic 1).
fn is_not_migrated(code: &str, message: &str) -> bool {
    matches!(code, "42P01" | "42883" | "3F000" | "1146" | "42S02")
        || (code == "1" && message.starts_with("no such table"))
}

/// PostgreSQL admin shutdown / cannot connect now; MySQL server gone.
fn is_unavailable(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "2006" | "2013")
}

pub(crate) trait ResultExt<T> {
    fn store(self) -> Result<T, StoreError>;
}

impl<T> ResultExt<T> for Result<T, sqlx::Error> {
    fn store(self) -> Result<T, StoreError> {
        self.map_err(store_error)
    }
}

pub(crate) use outbox_sql::error::during;
