//! Text codes stored for enums, shared by every SQL dialect.

use outbox_core::store::{AttemptKind, FailReason};
use outbox_core::{ErrorClass, StoreError};

/// Row status: waiting to be claimed (or delayed, or behind its key's
/// head).
pub const PENDING: i16 = 0;
/// Row status: leased by a relay.
pub const IN_FLIGHT: i16 = 1;
/// Row status: published.
pub const PUBLISHED: i16 = 2;
/// Row status: failed for good (the PostgreSQL statements spell the code
/// out in their SQL text).
pub const FAILED: i16 = 3;
/// Row status (MySQL, SQLite): pending, parked behind a failed row that
/// blocks its key. A per-key claim that meets such a row sets it aside,
/// so later claims never step over it; an operator's requeue, skip or
/// supersede (or a claim that finds the block gone) sets it back to
/// [`PENDING`]. (PostgreSQL's statements spell their own codes.)
pub const PARKED: i16 = 4;
/// Row status (MySQL, SQLite): pending, waiting behind an earlier row of
/// its key that is not yet due (a retry's backoff, a delay). A per-key
/// claim that meets such a row sets it aside; a claim that finds its key's
/// head due sets it back to [`PENDING`] and leases it behind the head.
pub const WAITING: i16 = 5;

/// Mark (SQLite's claim read only, never stored): a row held back behind
/// a blocking row of its key that is neither failed nor claimable (in
/// flight, not yet due): it stays where it is.
pub const HELD_BACK: i16 = 9;

/// How often (in claims of one store handle) a claim sets back rows set
/// aside ([`PARKED`], [`WAITING`]) whose block or wait ended by other
/// means (SQL by hand, an earlier release): that read steps over every
/// such row, so most claims skip it.
pub const HEAL_SET_ASIDE_EVERY: u64 = 64;

/// At most this many times one claim sets aside what its read found held
/// back and reads again (each time up to a batch of rows).
pub const SET_ASIDE_ROUNDS: usize = 16;

/// The text stored for an attempt kind.
pub fn attempt_kind_code(kind: AttemptKind) -> &'static str {
    match kind {
        AttemptKind::TransientFailure => "TransientFailure",
        AttemptKind::PermanentFailure => "PermanentFailure",
        AttemptKind::AttemptsExhausted => "AttemptsExhausted",
        AttemptKind::CrashLoop => "CrashLoop",
        AttemptKind::Requeued => "Requeued",
        AttemptKind::Skipped => "Skipped",
        AttemptKind::Superseded => "Superseded",
        AttemptKind::Unreadable => "Unreadable",
    }
}

/// The attempt kind stored as `code`.
pub fn attempt_kind(code: &str) -> Result<AttemptKind, StoreError> {
    Ok(match code {
        "TransientFailure" => AttemptKind::TransientFailure,
        "PermanentFailure" => AttemptKind::PermanentFailure,
        "AttemptsExhausted" => AttemptKind::AttemptsExhausted,
        "CrashLoop" => AttemptKind::CrashLoop,
        "Requeued" => AttemptKind::Requeued,
        "Skipped" => AttemptKind::Skipped,
        "Superseded" => AttemptKind::Superseded,
        "Unreadable" => AttemptKind::Unreadable,
        other => return Err(StoreError::fatal(format!("unknown attempt kind {other:?}"))),
    })
}

/// The error class stored as `code`.
pub fn error_class(code: &str) -> Result<ErrorClass, StoreError> {
    Ok(match code {
        "transient" => ErrorClass::Transient,
        "permanent" => ErrorClass::Permanent,
        "outage" => ErrorClass::Outage,
        other => return Err(StoreError::fatal(format!("unknown error class {other:?}"))),
    })
}

/// The history kind a nack records.
pub fn nack_kind(action: &outbox_core::store::NackAction) -> AttemptKind {
    use outbox_core::store::NackAction;
    match action {
        NackAction::Retry { .. } => AttemptKind::TransientFailure,
        NackAction::Fail {
            reason: FailReason::Permanent,
            ..
        } => AttemptKind::PermanentFailure,
        NackAction::Fail {
            reason: FailReason::AttemptsExhausted,
            ..
        } => AttemptKind::AttemptsExhausted,
    }
}
