//! Claims, leases and the settlements that end them.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::event::{EventId, StoredEvent, UnreadableEvent};
use crate::policy::{Ordering, PoisonPolicy};
use crate::publisher::ErrorClass;

/// Names a relay instance; recorded as lease owner and in attempt history.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RelayId(String);

impl RelayId {
    /// A relay id from a name (host + process is a good choice).
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// `"{prefix}-{random}"`, unique per process start.
    pub fn unique(prefix: &str) -> Self {
        Self(format!("{prefix}-{}", &EventId::random().to_string()[..8]))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RelayId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A per-row counter issued afresh by every claim. Every later transition of
/// the row is conditional on it, so a relay that lost its lease cannot
/// overwrite a newer claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FencingToken(pub i64);

/// What a claim grants: one row, until `expires_at`, under one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The row.
    pub sequence: i64,
    /// The event in the row.
    pub event_id: EventId,
    /// The token every settlement must present.
    pub fencing_token: FencingToken,
    /// When another relay may claim the row again.
    pub lease_expires_at: DateTime<Utc>,
}

/// A leased event, handed to a relay for publishing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedEvent {
    /// The event.
    pub event: StoredEvent,
    /// The lease on it.
    pub lease: Lease,
}

/// Parameters of one claim.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// Who claims.
    pub owner: RelayId,
    /// Most events to claim.
    pub limit: usize,
    /// How long the lease lasts.
    pub lease_duration: Duration,
    /// Per-key ordering or none.
    pub ordering: Ordering,
    /// What a crash-looping event does to its key.
    pub poison: PoisonPolicy,
    /// Claims that may end without any outcome (the relay died while
    /// publishing) before the event is failed as a crash loop instead of
    /// being claimed again.
    pub crash_loop_limit: u32,
}

/// The result of a claim.
#[derive(Clone, Debug, Default)]
pub struct ClaimedBatch {
    /// Leased events. Per key, in enqueue order, and always a prefix of the
    /// key's unpublished events.
    pub events: Vec<ClaimedEvent>,
    /// Events this claim moved to `failed` as crash loops instead of leasing.
    pub crash_looped: Vec<StoredEvent>,
    /// Rows this claim found undecodable and moved to `failed` on their own
    /// (history kind `Unreadable`), instead of leasing them.
    pub unreadable: Vec<UnreadableEvent>,
}

/// Why a failed publish attempt ended the event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailReason {
    /// The publisher classified the error as permanent.
    Permanent,
    /// Transient failures used up the retry budget.
    AttemptsExhausted,
}

/// What a negative acknowledgement does to the row.
#[derive(Clone, Debug, PartialEq)]
pub enum NackAction {
    /// Back to `pending`, publishable again after `after`; counts an attempt.
    Retry {
        /// Backoff before the next attempt.
        after: Duration,
    },
    /// To `failed` (dead letter); counts an attempt.
    Fail {
        /// Why.
        reason: FailReason,
        /// Park the key behind it (`PoisonPolicy::Block`).
        block_key: bool,
    },
}

/// A failed attempt to settle.
#[derive(Clone, Debug, PartialEq)]
pub struct Nack {
    /// The lease being settled.
    pub lease: Lease,
    /// Retry or fail.
    pub action: NackAction,
    /// The publisher's error class.
    pub error_class: ErrorClass,
    /// The publisher's error message, kept in history.
    pub error: String,
}

/// Hands a leased row back without an outcome: shutdown, broker outage, or a
/// lease too short to publish safely. Burns no attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct Release {
    /// The lease being returned.
    pub lease: Lease,
    /// Whether publishing had started. A started-but-unfinished attempt still
    /// counts towards crash-loop detection.
    pub attempt_started: bool,
}

impl Release {
    /// `lease` handed back before publishing started (no crash to blame).
    pub fn unstarted(lease: Lease) -> Self {
        Self {
            lease,
            attempt_started: false,
        }
    }
}

/// What a settlement (ack, nack, release) did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SettleReport {
    /// Rows updated.
    pub applied: usize,
    /// Rows whose token no longer matched: another claim superseded this
    /// lease, so the update was refused.
    pub fenced: Vec<EventId>,
}

impl SettleReport {
    /// Adds another report's counts to this one.
    pub fn merge(&mut self, other: SettleReport) {
        self.applied += other.applied;
        self.fenced.extend(other.fenced);
    }
}

/// Whether an enqueue wrote a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// A new row with this sequence.
    Inserted {
        /// The row's sequence.
        sequence: i64,
    },
    /// An event with this id already exists; nothing was written.
    AlreadyExists,
}
