//! The core's error type. Every variant says whether retrying can help.

use crate::event::{EventId, InvalidEvent};

/// Boxed source error from a backend driver.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error from a store or inbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The event was refused at enqueue; nothing was written.
    #[error("invalid event: {0}")]
    InvalidEvent(#[from] InvalidEvent),
    /// The backend could not be reached or timed out; retrying may help.
    #[error("store unavailable: {0}")]
    Unavailable(#[source] BoxError),
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
    #[error("store error: {source}")]
    Backend {
        /// Whether retrying the same call may succeed.
        retryable: bool,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
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
    pub fn retryable(source: impl Into<BoxError>) -> Self {
        Self::Backend {
            retryable: true,
            source: source.into(),
        }
    }

    /// Wraps a driver error that retrying will not cure.
    pub fn fatal(source: impl Into<BoxError>) -> Self {
        Self::Backend {
            retryable: false,
            source: source.into(),
        }
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
}
