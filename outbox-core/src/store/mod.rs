//! The store side of the outbox.

mod admin;
mod crash;
mod history;
mod lease;
mod traits;

pub use admin::{
    BlockedKey, EventState, EventTypeStats, FailedEvent, HeldBack, OpenTransaction, OperatorAction,
    RelayStatus,
};
pub use crash::{CrashVerdict, SuspectAllowance, crash_culprit, judge_crash};
pub use history::{AttemptKind, AttemptRecord};
pub use lease::{
    ClaimRequest, ClaimedBatch, ClaimedEvent, EnqueueOutcome, FailReason, FencingToken, Lease,
    Nack, NackAction, RelayId, Release, SettleReport,
};
pub use traits::{OutboxAdmin, OutboxStore, OutboxWriter};
