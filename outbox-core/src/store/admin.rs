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
    /// Pending, due now and not behind a failed event that blocks its key
    /// (an earlier event of the same key may still be in flight or parked:
    /// those hold it only until they settle or come due).
    pub claimable: u64,
    /// How long the oldest claimable event has been due: the relay's lag.
    pub oldest_claimable_age: Option<Duration>,
    /// Pending but not yet due: retry backoff or a requested delay (and not
    /// behind a blocking failed event).
    pub parked: u64,
    /// Pending behind a failed event that blocks its key
    /// ([`PoisonPolicy::Block`](crate::PoisonPolicy::Block)): they wait for
    /// an operator, not a relay, so they are neither claimable nor in the
    /// lag. Their sum over types is the backlog [`blocked_keys`](super::OutboxAdmin::blocked_keys) reports.
    pub blocked: u64,
    /// Leased to a relay.
    pub in_flight: u64,
    /// Dead-lettered.
    pub failed: u64,
}

impl EventTypeStats {
    /// The counts by state, named as metrics labels, `status --output
    /// json` and the dashboard name them, in that order.
    pub fn counts(&self) -> [(&'static str, u64); 5] {
        [
            ("claimable", self.claimable),
            ("parked", self.parked),
            ("blocked", self.blocked),
            ("in_flight", self.in_flight),
            ("failed", self.failed),
        ]
    }
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

/// One page of failed events an operator looks at: those of a type and a
/// key (each optional), after the sequence of the last one seen (keyset
/// paging: a page costs the same at the millionth failed event as at the
/// first), at most `limit`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailedPage {
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only this partition key.
    pub partition_key: Option<String>,
    /// Only events after this sequence (the last one of the page before).
    pub after_sequence: Option<i64>,
    /// Most events returned.
    pub limit: usize,
}

impl FailedPage {
    /// The first `limit` failed events, oldest first.
    pub fn first(limit: usize) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// Only events of `event_type`.
    pub fn of_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Only events of `partition_key`.
    pub fn with_key(mut self, partition_key: impl Into<String>) -> Self {
        self.partition_key = Some(partition_key.into());
        self
    }

    /// Only events after `sequence`.
    pub fn after(mut self, sequence: i64) -> Self {
        self.after_sequence = Some(sequence);
        self
    }

    /// Whether `failed` is on this page's side of its filters (type, key,
    /// after), ignoring the limit.
    pub fn admits(&self, failed: &FailedEvent) -> bool {
        let event = &failed.event.event;
        self.event_type
            .as_ref()
            .is_none_or(|t| &event.event_type == t)
            && self
                .partition_key
                .as_ref()
                .is_none_or(|k| &event.partition_key == k)
            && self
                .after_sequence
                .is_none_or(|after| failed.event.sequence > after)
    }
}

/// How many failed events a filter matches that an operator may still act
/// on (not superseded), and the newest one's sequence: what a bulk action
/// counts before its confirmation, and the bound it then acts within (an
/// event failing after the count is not swept up by it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailedCount {
    /// Failed events matching, not superseded.
    pub count: u64,
    /// The newest one's sequence, if any matched.
    pub last_sequence: Option<i64>,
}

impl FailedCount {
    /// A count of `count` events, the newest at `last_sequence`.
    pub fn new(count: u64, last_sequence: Option<i64>) -> Self {
        Self {
            count,
            last_sequence,
        }
    }
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
    /// Its last heartbeat, on store time.
    pub last_seen: DateTime<Utc>,
    /// Its host clock minus store time at that heartbeat: for operators
    /// (leases never use a host clock).
    pub clock_skew: chrono::Duration,
    /// Set while it is paused because its publisher reports an outage.
    pub outage: Option<RelayOutage>,
}

/// A relay paused by a publisher outage, as the store recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayOutage {
    /// Where it publishes.
    pub destination: String,
    /// The publisher's latest error.
    pub reason: String,
    /// When the outage was first recorded, on store time.
    pub since: DateTime<Utc>,
}

impl RelayOutage {
    /// The outage a relay row's nullable columns describe: none unless both
    /// the start and the destination are set (a store writes them together).
    pub fn from_columns(
        since: Option<DateTime<Utc>>,
        destination: Option<String>,
        reason: Option<String>,
    ) -> Option<Self> {
        Some(Self {
            since: since?,
            destination: destination?,
            reason: reason.unwrap_or_default(),
        })
    }
}

/// Something that keeps pending events from being published now ("what
/// holds publication back"). [`OutboxAdmin::held_back`](super::OutboxAdmin::held_back) lists
/// every cause present; an empty list with a backlog means the relays are
/// simply behind (or not running: see [`OutboxAdmin::relays`](super::OutboxAdmin::relays)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeldBack {
    /// Failed events park their keys under `PoisonPolicy::Block` until an
    /// operator requeues, skips or supersedes them.
    BlockedKeys {
        /// Keys parked.
        keys: u64,
        /// Events waiting behind them.
        waiting: u64,
    },
    /// Keys whose earliest pending event waits for its retry backoff or a
    /// requested delay; the events behind it wait too.
    BackingOff {
        /// Keys waiting.
        keys: u64,
        /// Events waiting (the due ones behind a waiting head included).
        waiting: u64,
        /// When the first of them is due.
        next_due: DateTime<Utc>,
    },
    /// Leases that expired with events in flight that no claim has taken
    /// back yet: no relay has claimed since (are relays running?).
    ExpiredLeases {
        /// Expired leases.
        leases: u64,
        /// Events in them.
        events: u64,
        /// When the first expired.
        first_expired_at: DateTime<Utc>,
    },
    /// Leases held much longer than a batch takes (a hung or paused
    /// relay): their keys wait until they settle or expire.
    LongLeases {
        /// Owners of such leases.
        owners: Vec<String>,
        /// Events in them.
        events: u64,
        /// When the oldest was claimed.
        oldest_claimed_at: DateTime<Utc>,
        /// When the first of them expires.
        first_expires_at: DateTime<Utc>,
    },
    /// Events that were in flight when a relay crashed or its lease expired:
    /// they go back in shrinking groups (halves of the suspects) until the
    /// crash is pinned on one event or none crashes again
    /// ([`judge_crash`](crate::store::judge_crash)).
    CrashSuspects {
        /// Suspected events.
        events: u64,
    },
    /// Transactions still open that have written outbox rows: their events
    /// become publishable when they commit, and nothing else waits for them.
    OpenTransactions {
        /// The transactions, oldest first.
        transactions: Vec<OpenTransaction>,
    },
}

/// A database transaction still open (as far as the server lets the store
/// see it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenTransaction {
    /// Server process id.
    pub pid: i64,
    /// Database name.
    pub database: String,
    /// When the transaction began.
    pub started_at: DateTime<Utc>,
    /// Session state (`active`, `idle in transaction`, ...).
    pub state: String,
    /// When its current or last statement started.
    pub query_started_at: Option<DateTime<Utc>>,
}
