//! Pieces of the admin trait every dialect shares.

use chrono::{DateTime, Utc};
use outbox_core::clock::elapsed_between;
use outbox_core::store::{
    AttemptRecord, BlockedKey, EventState, EventTypeStats, HeldBack, OutboxAdmin, RelayOutage,
    RelayStatus,
};
use outbox_core::{EventId, StoreError};

use crate::codes;
use crate::row::Row;

/// Why an operator action (requeue, skip, supersede) matched no row: the
/// event does not exist, or it is not failed-and-not-superseded.
pub async fn explain_miss<A: OutboxAdmin + ?Sized>(admin: &A, event_id: EventId) -> StoreError {
    match admin.event_state(event_id).await {
        Ok(None) => StoreError::NotFound(event_id),
        Ok(Some(state)) => StoreError::WrongState {
            event_id,
            actual: state.name(),
            expected: "failed (not superseded)",
        },
        Err(e) => e,
    }
}

/// An attempt-history row (`kind`, `at`, `actor`, `error_class`, `detail`,
/// `attempts`), as every dialect's history statements return it.
pub fn attempt_record(row: &Row) -> Result<AttemptRecord, StoreError> {
    Ok(AttemptRecord {
        kind: codes::attempt_kind(&row.text("kind")?)?,
        at: row.time("at")?,
        actor: row.text("actor")?,
        error_class: row
            .opt_text("error_class")?
            .as_deref()
            .map(codes::error_class)
            .transpose()?,
        detail: row.text("detail")?,
        attempts: row.int("attempts")? as u32,
    })
}

/// An event's state from its row (`status`, `attempts`, `available_at`,
/// `lease_owner`, `lease_expires_at`, `published_at`, `blocks_key`,
/// `superseded_by`), as the stores that keep leases on rows return it.
pub fn event_state(r: &Row) -> Result<EventState, StoreError> {
    let attempts = r.int("attempts")? as u32;
    Ok(match i16::try_from(r.int("status")?).unwrap_or(-1) {
        codes::PENDING | codes::PARKED | codes::WAITING => EventState::Pending {
            available_at: r.time("available_at")?,
            attempts,
        },
        codes::IN_FLIGHT => EventState::InFlight {
            owner: r.opt_text("lease_owner")?.unwrap_or_default(),
            lease_expires_at: r.time("lease_expires_at")?,
        },
        codes::PUBLISHED => EventState::Published {
            published_at: r.time("published_at")?,
        },
        _ => EventState::Failed {
            blocks_key: r.bool("blocks_key")?,
            superseded_by: superseded_by(r)?,
        },
    })
}

/// The replacement of a superseded failed event (`superseded_by`, text).
pub fn superseded_by(r: &Row) -> Result<Option<EventId>, StoreError> {
    r.opt_text("superseded_by")?
        .map(|t| t.parse().map_err(StoreError::fatal))
        .transpose()
}

/// One event type's row of the stats statement (`event_type`, the counts
/// `claimable`, `parked`, `in_flight`, `failed`, `blocked`, and the
/// `oldest` claimable row's time), ages taken at store time `now`.
pub fn type_stats(r: &Row, now: DateTime<Utc>) -> Result<EventTypeStats, StoreError> {
    Ok(EventTypeStats {
        event_type: r.text("event_type")?,
        claimable: r.count("claimable")?,
        oldest_claimable_age: r.opt_time("oldest")?.map(|t| elapsed_between(now, t)),
        parked: r.count("parked")?,
        in_flight: r.count("in_flight")?,
        failed: r.count("failed")?,
        blocked: r.count("blocked")?,
    })
}

/// What holds publication back, from the held-back statement's one row:
/// blocked keys, backoffs, expired leases, long leases (where the dialect
/// reports them: `long_claimed_at` …), crash suspects; in that order.
pub fn held_back(r: &Row) -> Result<Vec<HeldBack>, StoreError> {
    let mut held = Vec::new();
    if r.count("blocked_keys")? > 0 {
        held.push(HeldBack::BlockedKeys {
            keys: r.count("blocked_keys")?,
            waiting: r.count("blocked_waiting")?,
        });
    }
    if let Some(next_due) = r.opt_time("next_due")? {
        held.push(HeldBack::BackingOff {
            keys: r.count("backoff_keys")?,
            waiting: r.count("backoff_waiting")?,
            next_due,
        });
    }
    if let Some(first_expired_at) = r.opt_time("first_expired_at")? {
        held.push(HeldBack::ExpiredLeases {
            leases: r.count("expired_leases")?,
            events: r.count("expired_events")?,
            first_expired_at,
        });
    }
    if r.has("long_claimed_at") {
        if let (Some(oldest_claimed_at), Some(first_expires_at)) = (
            r.opt_time("long_claimed_at")?,
            r.opt_time("long_expires_at")?,
        ) {
            held.push(HeldBack::LongLeases {
                owners: r.texts("long_owners")?,
                events: r.count("long_events")?,
                oldest_claimed_at,
                first_expires_at,
            });
        }
    }
    if r.count("suspects")? > 0 {
        held.push(HeldBack::CrashSuspects {
            events: r.count("suspects")?,
        });
    }
    Ok(held)
}

/// A row of the blocked-keys statement.
pub fn blocked_key(r: &Row) -> Result<BlockedKey, StoreError> {
    Ok(BlockedKey {
        partition_key: r.text("partition_key")?,
        blocking_event_id: r.event_id("event_id")?,
        backlog: r.count("backlog")?,
    })
}

/// A row of the relays statement (heartbeat, clock skew, outage).
pub fn relay_status(r: &Row) -> Result<RelayStatus, StoreError> {
    Ok(RelayStatus {
        relay: r.text("relay")?,
        last_seen: r.time("last_seen")?,
        clock_skew: chrono::Duration::milliseconds(r.int("clock_skew_ms")?),
        outage: RelayOutage::from_columns(
            r.opt_time("outage_since")?,
            r.opt_text("outage_destination")?,
            r.opt_text("outage_reason")?,
        ),
    })
}
