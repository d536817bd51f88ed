//! The store side of the outbox.

mod admin;
mod crash;
mod heartbeat;
mod history;
mod lease;
mod traits;

pub use admin::{
    BlockedKey, EventState, EventTypeStats, FailedCount, FailedEvent, FailedPage, HeldBack,
    OpenTransaction, OperatorAction, RelayOutage, RelayStatus,
};
pub use crash::{CrashVerdict, SuspectAllowance, crash_culprit, judge_crash};
pub use heartbeat::{
    Heartbeat, OUTAGE_DESTINATION_MAX_CHARS, OUTAGE_REASON_MAX_CHARS, PublisherOutage,
};
pub use history::{AttemptKind, AttemptRecord};
pub use lease::{
    ClaimRequest, ClaimedBatch, ClaimedEvent, EnqueueOutcome, FailReason, FencingToken, Lease,
    Nack, NackAction, RelayId, Release, SettleReport,
};
pub use traits::{OutboxAdmin, OutboxStore, OutboxWriter, one_at_a_time};
