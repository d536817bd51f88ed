//! What the command reports when it cannot do what was asked, and the exit
//! status that goes with it.

use std::process::ExitCode;

/// A failure with its message (one line) and exit status.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    message: String,
    status: u8,
}

impl CliError {
    /// Bad input: arguments or settings that cannot work (exit status 2, as
    /// clap's own usage errors).
    pub fn usage(message: impl std::fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            status: 2,
        }
    }

    /// The store could not be reached or opened (exit status 3).
    pub fn unreachable(kind: &str, error: impl std::fmt::Display) -> Self {
        Self {
            message: format!("cannot reach the {kind} store: {error}"),
            status: 3,
        }
    }

    /// Anything else that went wrong, or an unhealthy outbox (exit status 1).
    pub fn failure(message: impl std::fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            status: 1,
        }
    }

    /// Working, but a relay is paused because its broker is down: events
    /// are safe in the store and wait (exit status 4).
    pub fn degraded(message: impl std::fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            status: 4,
        }
    }

    /// The process's exit status.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.status)
    }
}

// The store's error already says what it is ("store unavailable: …",
// "store error: claim_batch on …: …"): no prefix of ours.
impl From<outbox_core::StoreError> for CliError {
    fn from(error: outbox_core::StoreError) -> Self {
        Self::failure(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store's error already names itself: one prefix, never
    /// "store error: store error: …".
    #[test]
    fn a_store_error_is_said_once() {
        let backend = outbox_core::StoreError::Backend {
            retryable: false,
            error: "permission denied for table outbox_events".into(),
        }
        .during("stats", "billing.outbox_events");
        let message = CliError::from(backend).to_string();
        assert_eq!(message.matches("store error").count(), 1, "{message}");
        assert!(
            message.contains("stats on billing.outbox_events"),
            "{message}"
        );
    }
}
