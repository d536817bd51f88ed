//! Append-only attempt and operator history.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::publisher::ErrorClass;

/// What one history entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptKind {
    /// A publish attempt failed transiently; the event will be retried.
    TransientFailure,
    /// A publish attempt failed permanently; the event failed.
    PermanentFailure,
    /// The last allowed attempt failed; the event failed.
    AttemptsExhausted,
    /// Attempts kept starting and never finishing; the event failed.
    CrashLoop,
    /// An operator moved the event back to pending.
    Requeued,
    /// An operator unblocked the key, leaving the event failed.
    Skipped,
    /// An operator replaced the event by another.
    Superseded,
    /// The row could not be decoded into an event (written by another tool
    /// or version); it failed on its own, its neighbours went on.
    Unreadable,
}

/// One entry in an event's history. Entries are appended, never rewritten.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// What happened.
    pub kind: AttemptKind,
    /// When.
    pub at: DateTime<Utc>,
    /// The relay or operator who acted.
    pub actor: String,
    /// The publisher's error class, for attempt failures.
    pub error_class: Option<ErrorClass>,
    /// The error message or the operator's reason.
    pub detail: String,
    /// Failed attempts counted after this entry.
    pub attempts: u32,
}
