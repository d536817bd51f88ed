//! The alert hook: fired when an event is dead-lettered.

use crate::event::StoredEvent;

/// Why an event was moved to `failed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureCause {
    /// The publisher said it can never be published.
    Permanent,
    /// Transient failures used up the retry budget.
    AttemptsExhausted,
    /// Attempts kept starting and never finishing.
    CrashLoop,
    /// The stored row does not decode into an event.
    Unreadable,
}

/// What the alert hook is told.
#[derive(Clone, Debug)]
pub struct FailedAlert {
    /// The event.
    pub event: StoredEvent,
    /// Why it failed.
    pub cause: FailureCause,
    /// The last error.
    pub error: String,
    /// Whether its key is now parked behind it.
    pub key_blocked: bool,
}

/// Called once per event moved to `failed`. Keep it quick: it runs on the
/// relay's task (hand heavy work to a channel).
pub trait AlertHook: Send + Sync {
    /// An event was dead-lettered.
    fn event_failed(&self, alert: &FailedAlert);
}

impl<F: Fn(&FailedAlert) + Send + Sync> AlertHook for F {
    fn event_failed(&self, alert: &FailedAlert) {
        self(alert)
    }
}

/// Logs each failure at `error` level through `tracing`. The default hook.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogAlert;

impl AlertHook for LogAlert {
    fn event_failed(&self, alert: &FailedAlert) {
        tracing::error!(
            event_id = %alert.event.event_id,
            event_type = %alert.event.event_type,
            partition_key = %alert.event.partition_key,
            cause = ?alert.cause,
            key_blocked = alert.key_blocked,
            error = %alert.error,
            "outbox event failed"
        );
    }
}
