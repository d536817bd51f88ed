//! Types the maintenance trait answers with.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::history::AttemptRecord;
use crate::event::{EventId, StoredEvent};

/// Counts for one event type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventTypeStats {
    /// The event type.
    pub event_type: String,
    /// Pending and due now (an earlier event of the same key may still hold
    /// one back).
    pub claimable: u64,
    /// How long the oldest claimable event has been due: the relay's lag.
    pub oldest_claimable_age: Option<Duration>,
    /// Pending but not yet due: retry backoff or a requested delay.
    pub parked: u64,
    /// Leased to a relay.
    pub in_flight: u64,
    /// Dead-lettered.
    pub failed: u64,
}

/// Where one event stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventState {
    /// Waiting to be claimed (possibly until `available_at`).
    Pending {
        /// Earliest publish time.
        available_at: DateTime<Utc>,
        /// Failed attempts so far.
        attempts: u32,
    },
    /// Leased to a relay.
    InFlight {
        /// The lease owner.
        owner: String,
        /// When the lease expires.
        lease_expires_at: DateTime<Utc>,
    },
    /// Delivered to the broker.
    Published {
        /// When the ack was recorded.
        published_at: DateTime<Utc>,
    },
    /// Dead-lettered.
    Failed {
        /// Whether its key is parked behind it.
        blocks_key: bool,
        /// The event that replaced it, if superseded.
        superseded_by: Option<EventId>,
    },
}

impl EventState {
    /// A short name: `pending`, `in_flight`, `published`, `failed`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pending { .. } => "pending",
            Self::InFlight { .. } => "in_flight",
            Self::Published { .. } => "published",
            Self::Failed { .. } => "failed",
        }
    }
}

/// A failed event with its history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedEvent {
    /// The event.
    pub event: StoredEvent,
    /// Whether its key is parked behind it.
    pub blocks_key: bool,
    /// The event that replaced it, if superseded.
    pub superseded_by: Option<EventId>,
    /// Everything that happened to it, oldest first.
    pub history: Vec<AttemptRecord>,
}

/// A key parked behind a failed event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedKey {
    /// The partition key.
    pub partition_key: String,
    /// The failed event at its head.
    pub blocking_event_id: EventId,
    /// Unpublished events waiting behind it.
    pub backlog: u64,
}

/// Who performs an operator action, and why. Both are kept in history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorAction {
    /// The operator.
    pub operator: String,
    /// The reason.
    pub reason: String,
}

impl OperatorAction {
    /// An action by `operator` for `reason`.
    pub fn new(operator: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            operator: operator.into(),
            reason: reason.into(),
        }
    }
}

/// A relay's last sign of life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayStatus {
    /// The relay.
    pub relay: String,
    /// Its last heartbeat.
    pub last_seen: DateTime<Utc>,
}
