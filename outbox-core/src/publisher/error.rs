//! Publisher errors, classified.

use serde::{Deserialize, Serialize};

use crate::error::BoxError;

/// How the relay treats a publish failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorClass {
    /// This event failed for now (timeout, throttling): retry it with backoff.
    Transient,
    /// This event can never be published as is (too large, invalid topic,
    /// serialization): fail it at once and fire the alert hook.
    Permanent,
    /// The broker is unreachable: pause the whole relay, burn no attempts.
    Outage,
}

impl ErrorClass {
    /// `transient`, `permanent` or `outage`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Permanent => "permanent",
            Self::Outage => "outage",
        }
    }
}

/// A classified publish failure for one event.
#[derive(Debug, thiserror::Error)]
#[error("{} publish error: {message}", class.as_str())]
pub struct PublishError {
    /// How the relay treats it.
    pub class: ErrorClass,
    /// What went wrong, kept in the event's history.
    pub message: String,
    /// The client library's error.
    #[source]
    pub source: Option<BoxError>,
}

impl PublishError {
    /// An error of `class`.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
            source: None,
        }
    }

    /// Retry this event later.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Transient, message)
    }

    /// This event can never be published.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Permanent, message)
    }

    /// The broker is unreachable.
    pub fn outage(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Outage, message)
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }
}

/// One outcome per event handed to [`super::Publisher::publish`].
pub type PublishOutcome = Result<(), PublishError>;
