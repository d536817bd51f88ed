//! Crash blame for the stores that mark leases on the rows (MySQL, SQLite):
//! the rows of one lease that ended without an outcome, grouped by lease
//! and judged by [`crash_culprit`].

use std::collections::HashMap;

use outbox_core::EventId;
use outbox_core::store::crash_culprit;

/// `(sequence, 1 if the crash is blamed on it, else 0)` for rows given as
/// `(sequence, lease id, already a suspect)`.
pub(crate) fn blame(rows: &[(i64, i64, bool)]) -> Vec<(i64, i64)> {
    let mut by_lease: HashMap<i64, Vec<(i64, bool)>> = HashMap::new();
    for (sequence, lease, suspect) in rows {
        by_lease
            .entry(*lease)
            .or_default()
            .push((*sequence, *suspect));
    }
    by_lease
        .values()
        .flat_map(|rows| {
            let culprit = crash_culprit(rows);
            rows.iter()
                .map(move |(s, _)| (*s, i64::from(culprit == Some(*s))))
        })
        .collect()
}

/// A fresh id for one claim's lease (random: no counter to contend on).
pub(crate) fn new_lease_id() -> i64 {
    i64::from_le_bytes(
        EventId::random().as_uuid().as_bytes()[..8]
            .try_into()
            .expect("eight bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_lease_is_judged_on_its_own() {
        let mut blamed = blame(&[
            (1, 10, false),
            (2, 10, true),
            (3, 20, false),
            (4, 30, false),
            (5, 30, false),
        ]);
        blamed.sort();
        assert_eq!(blamed, vec![(1, 0), (2, 1), (3, 1), (4, 0), (5, 0)]);
    }
}
