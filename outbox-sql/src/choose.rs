//! A claim's choice in Rust, for the dialects whose statements return
//! candidates rather than a batch (MySQL, SQLite): which candidates a
//! lease takes, the leases it makes, and a nack's new row state.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use outbox_core::store::{ClaimedEvent, FencingToken, Lease, NackAction, SuspectAllowance};
use outbox_core::{StoredEvent, UnreadableEvent};

use crate::codes;

/// A claim's candidate in claim order: its sequence, key, and its span if
/// it is a crash suspect.
pub(crate) type Candidate = (i64, String, Option<u32>);

/// The candidates' rows as read for the lease: each one's fencing token
/// and decoding, by sequence (a row missing was skipped as locked).
pub(crate) type ReadRows = HashMap<i64, (i64, Result<StoredEvent, UnreadableEvent>)>;

/// What a claim leases from `candidates`, and the rows it fails as
/// unreadable. A row missing from `rows` (locked by a settlement in
/// progress), a crash suspect beyond the lease's allowance, or a row that
/// does not decode under Block ends its key's prefix (with per-key order,
/// nothing after it goes in this batch); keys in `stopped` take nothing.
pub(crate) fn choose<'a>(
    candidates: &'a [Candidate],
    rows: &ReadRows,
    (ordered, block): (bool, bool),
    mut stopped: HashSet<&'a str>,
) -> (Vec<i64>, Vec<UnreadableEvent>) {
    let mut suspects = SuspectAllowance::default();
    let mut chosen = Vec::new();
    let mut unreadable = Vec::new();
    for (sequence, key, suspect) in candidates {
        if ordered && stopped.contains(key.as_str()) {
            continue;
        }
        let Some((_, decoded)) = rows.get(sequence) else {
            stopped.insert(key);
            continue;
        };
        if suspect.is_some_and(|span| !suspects.admit(span)) {
            stopped.insert(key);
            continue;
        }
        match decoded {
            Ok(_) => chosen.push(*sequence),
            Err(bad) => {
                unreadable.push(bad.clone());
                if block {
                    stopped.insert(key);
                }
            }
        }
    }
    (chosen, unreadable)
}

/// The leased events of `chosen`, each under its row's next fencing token.
pub(crate) fn leased(
    chosen: &[i64],
    rows: &ReadRows,
    lease_expires_at: DateTime<Utc>,
) -> Vec<ClaimedEvent> {
    chosen
        .iter()
        .map(|sequence| {
            let (token, decoded) = &rows[sequence];
            let event = decoded.clone().expect("chosen rows decode");
            ClaimedEvent {
                lease: Lease {
                    sequence: *sequence,
                    event_id: event.event_id,
                    fencing_token: FencingToken(token + 1),
                    lease_expires_at,
                },
                event,
            }
        })
        .collect()
}

/// A nacked row's new status, whether it blocks its key, and when it is
/// due again (store time `now`, microseconds): a retry is pending after
/// its backoff, a failure is failed.
pub(crate) fn nack_state(action: &NackAction, now: i64) -> (i16, bool, Option<i64>) {
    match action {
        NackAction::Retry { after } => (
            codes::PENDING,
            false,
            Some(now.saturating_add(crate::param::micros(*after))),
        ),
        NackAction::Fail { block_key, .. } => (codes::FAILED, *block_key, None),
    }
}
