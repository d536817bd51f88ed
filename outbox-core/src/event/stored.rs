//! The event as a store holds it.

use std::ops::Deref;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::NewEvent;

/// A committed event read back from a store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEvent {
    /// Store-assigned insert sequence; identifies the row.
    pub sequence: i64,
    /// The event as enqueued.
    pub event: NewEvent,
    /// When the row was written.
    pub created_at: DateTime<Utc>,
    /// Earliest time the row may be published (delay or retry backoff).
    pub available_at: DateTime<Utc>,
    /// Failed publish attempts so far.
    pub attempts: u32,
}

impl Deref for StoredEvent {
    type Target = NewEvent;
    fn deref(&self) -> &NewEvent {
        &self.event
    }
}
