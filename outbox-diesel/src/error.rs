//! Diesel's errors as the core's, deciding retryability.

use diesel::result::DatabaseErrorKind;
use diesel::result::Error as DieselError;
use outbox_core::StoreError;

/// Serialization failures are conflicts (retry the transaction); a lost
/// connection is unavailable; the rest (bad SQL, constraint violations,
/// a row that does not map) retrying will not cure.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn store_error(error: DieselError) -> StoreError {
    match &error {
        DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, info) => {
            StoreError::Conflict(info.message().to_owned())
        }
        DieselError::DatabaseError(
            DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand,
            _,
        ) => StoreError::Unavailable(Box::new(error)),
        // diesel-async's MySQL backend keeps only the server's message for
        // errors it has no kind for (the number is gone): a deadlock or a
        // lock wait timeout asks to restart the transaction; mysql_async's
        // own I/O and driver errors mean the connection is gone.
        DieselError::DatabaseError(_, info) if not_migrated(info.message()) => {
            StoreError::Config(format!(
                "the outbox tables are missing or older than this version ({}): \
                 run migrate() (or `outbox migrate`) on this database and schema",
                info.message()
            ))
        }
        DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
            if info.message().contains("try restarting transaction") =>
        {
            StoreError::Conflict(info.message().to_owned())
        }
        DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
            if ["Input/output error", "Driver error"]
                .iter()
                .any(|p| info.message().starts_with(p)) =>
        {
            StoreError::Unavailable(Box::new(error))
        }
        _ => StoreError::fatal(error),
    }
}

/// A table, function or schema of the outbox missing. Diesel keeps no
/// SQLSTATE, only the server's message: PostgreSQL's undefined relation,
/// function or schema, MySQL's "Table … doesn't exist".
fn not_migrated(message: &str) -> bool {
    let missing_in_postgres = message.ends_with("does not exist")
        && ["relation ", "function ", "schema "]
            .iter()
            .any(|what| message.starts_with(what));
    let missing_in_mysql = message.starts_with("Table ") && message.ends_with("doesn't exist");
    missing_in_postgres || missing_in_mysql
}

#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) trait ResultExt<T> {
    fn store(self) -> Result<T, StoreError>;
}

impl<T> ResultExt<T> for Result<T, DieselError> {
    fn store(self) -> Result<T, StoreError> {
        self.map_err(store_error)
    }
}

/// The error of a Diesel transaction that enqueues: Diesel's own (the
/// business statements, begin/commit) or the outbox's. Use it as the
/// transaction's error type, or give yours `From` both, so `?` works on
/// either inside `conn.transaction(...)`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Diesel failed (a statement, the transaction).
    #[error("diesel: {0}")]
    Diesel(diesel::result::Error),
    /// The outbox refused or failed (bad input, a store error).
    #[error("outbox: {0}")]
    Outbox(StoreError),
}

// By hand, not `#[from]`: that would also make the inner error this error's
// `source` and repeat it in reports.
impl From<diesel::result::Error> for Error {
    fn from(error: diesel::result::Error) -> Self {
        Self::Diesel(error)
    }
}

impl From<StoreError> for Error {
    fn from(error: StoreError) -> Self {
        Self::Outbox(error)
    }
}

impl Error {
    /// As the core's error (Diesel's classified by retryability).
    pub fn into_store_error(self) -> StoreError {
        match self {
            Self::Diesel(error) => store_error(error),
            Self::Outbox(error) => error,
        }
    }
}
