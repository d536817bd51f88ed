//! The core's error type. Every variant says whether retrying can help.

use crate::event::{EventId, InvalidEvent};

/// Boxed source error from a backend driver.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error from a store or inbox.
///
/// Its text is the whole story, said once: what failed, in which operation
/// on which table (stores add it with [`StoreError::during`]), and the
/// driver's message. The driver's error is therefore not also returned as
/// [`source`](std::error::Error::source), where report printers would repeat
/// it ("…: pool timed out, caused by: pool timed out"); reach it with
/// [`StoreError::driver_error`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The event was refused at enqueue; nothing was written.
    #[error("invalid event: {0}")]
    InvalidEvent(InvalidEvent),
    /// The backend could not be reached or timed out; retrying may help.
    #[error("store unavailable: {0}")]
    Unavailable(BoxError),
    /// A concurrent transaction touched the same rows; retry the transaction.
    #[error("conflict with a concurrent transaction: {0}")]
    Conflict(String),
    /// No event with this id.
    #[error("no event with id {0}")]
    NotFound(EventId),
    /// The event is in a state the operation does not apply to.
    #[error("event {event_id} is {actual}, operation needs {expected}")]
    WrongState {
        /// The event.
        event_id: EventId,
        /// The state it is in.
        actual: &'static str,
        /// The state the operation needs.
        expected: &'static str,
    },
    /// Bad configuration (identifiers, limits); fix the code, do not retry.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Any other backend error.
    #[error("store error: {error}")]
    Backend {
        /// Whether retrying the same call may succeed.
        retryable: bool,
        /// The driver's error (with the operation, once a store added it).
        error: BoxError,
    },
}

/// A driver error with the store operation and table it happened in; what
/// [`StoreError::during`] wraps the driver's error in.
#[derive(Debug)]
pub struct DuringOperation {
    /// The store operation (`claim_batch`, `ack`, `stats`, `inbox claim`…).
    pub operation: &'static str,
    /// What it worked on (the qualified table, or the store's file).
    pub target: String,
    /// The driver's error.
    pub error: BoxError,
}

impl std::fmt::Display for DuringOperation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {}: {}", self.operation, self.target, self.error)
    }
}

impl std::error::Error for DuringOperation {}

// By hand, not `#[from]`: that would also make the event's error this
// error's `source` and repeat it in reports.
impl From<InvalidEvent> for StoreError {
    fn from(error: InvalidEvent) -> Self {
        Self::InvalidEvent(error)
    }
}

impl StoreError {
    /// Whether retrying the same operation may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Unavailable(_) | Self::Conflict(_) => true,
            Self::Backend { retryable, .. } => *retryable,
            Self::InvalidEvent(_)
            | Self::NotFound(_)
            | Self::WrongState { .. }
            | Self::Config(_) => false,
        }
    }

    /// Wraps a driver error that retrying may cure.
    pub fn retryable(error: impl Into<BoxError>) -> Self {
        Self::Backend {
            retryable: true,
            error: error.into(),
        }
    }

    /// Wraps a driver error that retrying will not cure.
    pub fn fatal(error: impl Into<BoxError>) -> Self {
        Self::Backend {
            retryable: false,
            error: error.into(),
        }
    }

    /// Says which store operation on which table failed, for errors that
    /// come from the driver (unavailable, conflict, backend); the others
    /// already say what is wrong. The innermost operation wins: an error
    /// that already names one is returned as it is.
    pub fn during(self, operation: &'static str, target: impl Into<String>) -> Self {
        let target = target.into();
        let wrap = |error: BoxError| -> BoxError {
            if error.is::<DuringOperation>() {
                error
            } else {
                Box::new(DuringOperation {
                    operation,
                    target: target.clone(),
                    error,
                })
            }
        };
        match self {
            Self::Unavailable(error) => Self::Unavailable(wrap(error)),
            Self::Backend { retryable, error } => Self::Backend {
                retryable,
                error: wrap(error),
            },
            // A conflict's text is all it has: one that already names an
            // operation on this target keeps the innermost, as boxed errors do.
            Self::Conflict(message) if !message.contains(&format!(" on {target}: ")) => {
                Self::Conflict(format!("{operation} on {target}: {message}"))
            }
            other => other,
        }
    }

    /// The driver's own error (an `sqlx::Error`, a `redis::RedisError`…),
    /// for downcasting; `None` for errors the outbox itself raised.
    pub fn driver_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        let error = match self {
            Self::Unavailable(error) | Self::Backend { error, .. } => error,
            _ => return None,
        };
        Some(match error.downcast_ref::<DuringOperation>() {
            Some(during) => during.error.as_ref(),
            None => error.as_ref(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryability_is_part_of_the_error() {
        assert!(StoreError::Conflict("x".into()).is_retryable());
        assert!(StoreError::retryable("io").is_retryable());
        assert!(!StoreError::fatal("syntax").is_retryable());
        assert!(!StoreError::from(InvalidEvent::EmptyField("event_type")).is_retryable());
    }

    /// What a report printer shows: the error, then each source.
    fn report(error: &dyn std::error::Error) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(&format!(", caused by: {cause}"));
            source = cause.source();
        }
        text
    }

    #[derive(Debug, thiserror::Error)]
    #[error("pool timed out while waiting for an open connection")]
    struct PoolTimedOut;

    #[test]
    fn the_cause_is_said_once_with_the_operation_and_table() {
        let error = StoreError::Unavailable(Box::new(PoolTimedOut))
            .during("claim_batch", "billing.outbox_events")
            .during("outer", "ignored");
        assert_eq!(
            report(&error),
            "store unavailable: claim_batch on billing.outbox_events: \
             pool timed out while waiting for an open connection"
        );
        assert!(error.is_retryable());
        assert!(error.driver_error().unwrap().is::<PoolTimedOut>());

        let fatal = StoreError::fatal(PoolTimedOut).during("ack", "outbox_events");
        assert_eq!(report(&fatal).matches("pool timed out").count(), 1);
        assert!(!fatal.is_retryable());
        let conflict = StoreError::Conflict("deadlock detected".into())
            .during("nack", "t")
            .during("history", "t");
        assert_eq!(
            conflict.to_string(),
            "conflict with a concurrent transaction: nack on t: deadlock detected"
        );
        let config = StoreError::Config("bad".into()).during("stats", "t");
        assert_eq!(config.to_string(), "invalid configuration: bad");
        assert!(config.driver_error().is_none());
    }
}
