//! Crash blame for the stores that mark leases on the rows (MySQL, SQLite):
//! the rows of one lease that ended without an outcome, grouped by lease
//! and judged by [`outbox_core::store::judge_crash`].

use std::collections::HashMap;

use outbox_core::EventId;
use outbox_core::store::{CrashVerdict, judge_crash};

/// Each lease's rows judged on their own, for rows given as `(sequence,
/// lease id, its suspect span if already a suspect)`.
pub fn blame(rows: &[(i64, i64, Option<u32>)]) -> Vec<CrashVerdict> {
    let mut by_lease: HashMap<i64, Vec<(i64, Option<u32>)>> = HashMap::new();
    for (sequence, lease, span) in rows {
        by_lease.entry(*lease).or_default().push((*sequence, *span));
    }
    by_lease
        .values()
        .flat_map(|rows| judge_crash(rows))
        .collect()
}

/// A row's suspect span as the tables keep it (`suspect`, `suspect_span`):
/// `None` if it is no suspect; rows made suspects before spans existed
/// (span 0) go alone.
pub fn suspect_span(suspect: bool, span: i64) -> Option<u32> {
    suspect.then(|| u32::try_from(span).unwrap_or(1).max(1))
}

/// A row a lease holds, as the reaper reads it.
pub struct InFlight {
    /// The row.
    pub sequence: i64,
    /// The claim that leased it.
    pub lease_id: i64,
    /// The relay that claimed it.
    pub owner: String,
    /// When the lease ends (store time, microseconds).
    pub expires_at: i64,
    /// The relay released it before publishing.
    pub unstarted: bool,
    /// Its suspect span, if it already shared a lease that crashed.
    pub suspect_span: Option<u32>,
}

/// What reaping the expired leases among `in_flight` does.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reaping {
    /// Rows of expired leases whose publishing may have started, judged:
    /// all become suspects, some blamed.
    pub blamed: Vec<CrashVerdict>,
    /// Rows of expired leases that never started (a relay's prefetch): back
    /// to pending, unblamed.
    pub returned: Vec<i64>,
    /// Rows of live leases younger than a reaped lease of their owner: mark
    /// them unstarted, for when they expire in turn.
    pub unstarted: Vec<i64>,
}

/// A relay publishes its leases one at a time in claim order and claims the
/// next meanwhile (prefetch): of one owner's leases in flight only the
/// oldest can have started publishing. Expired leases are blamed
/// ([`blame`]) if they could have started, returned otherwise.
pub fn reap(in_flight: &[InFlight], now: i64) -> Reaping {
    // Leases by owner, oldest first (same lease length: expiry order is
    // claim order).
    let mut leases: HashMap<i64, Vec<&InFlight>> = HashMap::new();
    for row in in_flight {
        leases.entry(row.lease_id).or_default().push(row);
    }
    let mut by_owner: HashMap<&str, Vec<(i64, i64)>> = HashMap::new();
    for (lease, rows) in &leases {
        by_owner
            .entry(rows[0].owner.as_str())
            .or_default()
            .push((rows[0].expires_at, *lease));
    }
    let mut reaping = Reaping::default();
    let mut started_expired = Vec::new();
    for owned in by_owner.values_mut() {
        owned.sort_unstable();
        let mut reaped = false;
        for (i, (expires_at, lease)) in owned.iter().enumerate() {
            let rows = &leases[lease];
            let unstarted = i > 0 || rows.iter().any(|r| r.unstarted);
            if *expires_at > now {
                if reaped {
                    reaping.unstarted.extend(rows.iter().map(|r| r.sequence));
                }
                continue;
            }
            reaped = true;
            if unstarted {
                reaping.returned.extend(rows.iter().map(|r| r.sequence));
            } else {
                started_expired.extend(rows.iter().map(|r| (r.sequence, *lease, r.suspect_span)));
            }
        }
    }
    reaping.blamed = blame(&started_expired);
    reaping
}

/// A fresh id for one claim's lease (random: no counter to contend on).
pub fn new_lease_id() -> i64 {
    i64::from_le_bytes(
        EventId::random().as_uuid().as_bytes()[..8]
            .try_into()
            .expect("eight bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(sequence: i64, lease_id: i64, owner: &str, expires_at: i64) -> InFlight {
        InFlight {
            sequence,
            lease_id,
            owner: owner.into(),
            expires_at,
            unstarted: false,
            suspect_span: None,
        }
    }

    #[test]
    fn a_prefetched_lease_goes_back_unblamed() {
        // relay-a died holding lease 1 (publishing) and 2 (prefetched);
        // relay-b's lease 3 is live.
        let rows = [
            row(1, 1, "relay-a", 100),
            row(2, 2, "relay-a", 105),
            row(3, 3, "relay-b", 500),
        ];
        let reaping = reap(&rows, 200);
        assert_eq!(verdicts(&reaping.blamed), vec![(1, true, 1)]);
        assert_eq!(reaping.returned, vec![2]);
        assert!(reaping.unstarted.is_empty());
    }

    #[test]
    fn a_younger_lease_is_marked_when_the_older_expires_first() {
        let rows = [row(1, 1, "relay-a", 100), row(2, 2, "relay-a", 105)];
        let reaping = reap(&rows, 102);
        assert_eq!(verdicts(&reaping.blamed), vec![(1, true, 1)]);
        assert_eq!(reaping.unstarted, vec![2]);
        let later = [InFlight {
            unstarted: true,
            ..row(2, 2, "relay-a", 105)
        }];
        assert_eq!(reap(&later, 200).returned, vec![2]);
    }

    #[test]
    fn each_lease_is_judged_on_its_own() {
        let mut blamed = verdicts(&blame(&[
            (1, 10, None),
            (2, 10, Some(1)),
            (3, 20, None),
            (4, 30, None),
            (5, 30, None),
        ]));
        blamed.sort();
        assert_eq!(
            blamed,
            vec![
                (1, false, 1),
                (2, true, 1),
                (3, true, 1),
                (4, false, 2),
                (5, false, 2)
            ]
        );
    }

    fn verdicts(verdicts: &[CrashVerdict]) -> Vec<(i64, bool, u32)> {
        verdicts
            .iter()
            .map(|v| (v.sequence, v.blamed, v.suspect_span))
            .collect()
    }

    #[test]
    fn spans_are_read_from_the_columns() {
        assert_eq!(suspect_span(false, 7), None);
        assert_eq!(suspect_span(true, 7), Some(7));
        assert_eq!(
            suspect_span(true, 0),
            Some(1),
            "rows from before spans go alone"
        );
    }
}
