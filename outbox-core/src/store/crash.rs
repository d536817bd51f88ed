//! What a lease that ended without an outcome says about its rows, and how
//! many of the rows under suspicion a later lease may carry. Every store
//! applies these rules (the SQL stores in SQL or through these functions).
//!
//! A lease can end without an outcome because its relay died (killed in a
//! deploy, paused past its lease, out of memory) or because an event
//! crashes the relay while being published: a poison event that would
//! crash every relay forever (DESIGN.md §4, crash loops). The first is far
//! more common and no event's fault, so a dead relay's rows go back
//! together and are published by the next lease. The second is found by
//! halving: rows that crash again with others are retried in halves, and a
//! crash of a lease with a single suspect (or a single row) is blamed on
//! it, towards the crash-loop limit. A poison event among `n` rows is
//! isolated after about `log2(n)` further crashes; a dead relay's keys come
//! back in one lease, not one per claim.

/// Which row of a lease a crash is blamed on (crash loops): the rows of
/// one lease that ended without an outcome after publishing may have
/// started, each with whether it was already a suspect. A crash counts on
/// one row only when it is certain which: the lease's one suspect, or the
/// only row. Otherwise nobody is blamed.
pub fn crash_culprit(rows: &[(i64, bool)]) -> Option<i64> {
    let mut suspects = rows.iter().filter(|(_, suspect)| *suspect);
    match (suspects.next(), suspects.next(), rows) {
        (Some((one, _)), None, _) => Some(*one),
        (None, _, [(only, _)]) => Some(*only),
        _ => None,
    }
}

/// What a crash makes of one row of the lease (see [`judge_crash`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashVerdict {
    /// The row.
    pub sequence: i64,
    /// The crash counts on this row (crash-loop detection).
    pub blamed: bool,
    /// The row is a suspect from now on, and a lease may carry at most this
    /// many suspects with it (at least 1).
    pub suspect_span: u32,
}

/// Judges the rows of one lease that ended without an outcome after
/// publishing may have started: `(sequence, its suspect span if it was
/// already a suspect)`. Every row becomes a suspect. The crash is blamed
/// where [`crash_culprit`] is certain, and that row goes alone from now on.
/// The lease's other earlier suspects crashed again together: half of them
/// may go together next time. Rows that were not suspects crashed for the
/// first time, so they may all go back together (a dead relay's batch
/// returns in one lease).
pub fn judge_crash(rows: &[(i64, Option<u32>)]) -> Vec<CrashVerdict> {
    let flags: Vec<(i64, bool)> = rows.iter().map(|(s, span)| (*s, span.is_some())).collect();
    let culprit = crash_culprit(&flags);
    let suspects = rows.iter().filter(|(_, span)| span.is_some()).count() as u32;
    let newcomers = rows.len() as u32 - suspects;
    rows.iter()
        .map(|(sequence, span)| {
            let blamed = culprit == Some(*sequence);
            let suspect_span = match (blamed, span) {
                (true, _) => 1,
                (false, Some(_)) => suspects.div_ceil(2),
                (false, None) => newcomers,
            }
            .max(1);
            CrashVerdict {
                sequence: *sequence,
                blamed,
                suspect_span,
            }
        })
        .collect()
}

/// Decides, in the order a claim meets them, which crash suspects one
/// lease takes: the longest run whose length stays within the smallest
/// span among them. Once one is refused, every later one is (the SQL
/// stores compute the same prefix with window functions).
#[derive(Clone, Copy, Debug, Default)]
pub struct SuspectAllowance {
    taken: u32,
    span: Option<u32>,
    closed: bool,
}

impl SuspectAllowance {
    /// Whether the lease takes a suspect of this span (0, as rows written
    /// before spans existed, counts as 1: alone).
    pub fn admit(&mut self, suspect_span: u32) -> bool {
        if self.closed {
            return false;
        }
        let span = self.span.unwrap_or(u32::MAX).min(suspect_span.max(1));
        if self.taken + 1 > span {
            self.closed = true;
            return false;
        }
        self.taken += 1;
        self.span = Some(span);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blame_is_laid_only_where_it_is_certain() {
        assert_eq!(crash_culprit(&[(7, false)]), Some(7));
        assert_eq!(crash_culprit(&[(1, false), (2, true), (3, false)]), Some(2));
        assert_eq!(crash_culprit(&[(1, false), (2, false)]), None);
        assert_eq!(crash_culprit(&[]), None);
    }

    fn spans(verdicts: &[CrashVerdict]) -> Vec<(i64, bool, u32)> {
        verdicts
            .iter()
            .map(|v| (v.sequence, v.blamed, v.suspect_span))
            .collect()
    }

    #[test]
    fn a_dead_relays_batch_goes_back_together() {
        let rows: Vec<(i64, Option<u32>)> = (1..=200).map(|s| (s, None)).collect();
        let verdicts = judge_crash(&rows);
        assert!(verdicts.iter().all(|v| !v.blamed && v.suspect_span == 200));
    }

    #[test]
    fn suspects_that_crash_again_are_halved_then_blamed() {
        let again: Vec<(i64, Option<u32>)> = (1..=6).map(|s| (s, Some(6))).collect();
        assert!(judge_crash(&again).iter().all(|v| v.suspect_span == 3));
        let three = [(1, Some(3)), (2, Some(3)), (3, Some(3)), (4, None)];
        assert_eq!(
            spans(&judge_crash(&three)),
            vec![(1, false, 2), (2, false, 2), (3, false, 2), (4, false, 1)]
        );
        let alone = [(9, Some(1)), (10, None), (11, None)];
        assert_eq!(
            spans(&judge_crash(&alone)),
            vec![(9, true, 1), (10, false, 2), (11, false, 2)]
        );
        assert_eq!(spans(&judge_crash(&[(5, None)])), vec![(5, true, 1)]);
    }

    #[test]
    fn a_lease_takes_suspects_within_the_smallest_span_then_none() {
        let mut allowance = SuspectAllowance::default();
        assert!(allowance.admit(3));
        assert!(allowance.admit(4));
        assert!(allowance.admit(3));
        assert!(!allowance.admit(3), "a fourth exceeds the span of 3");
        assert!(!allowance.admit(100), "after a refusal, none");
        let mut legacy = SuspectAllowance::default();
        assert!(legacy.admit(0));
        assert!(!legacy.admit(0), "rows without a span go alone");
        let mut shrinking = SuspectAllowance::default();
        assert!(shrinking.admit(5));
        assert!(!shrinking.admit(1), "two suspects exceed a span of 1");
    }

    /// Halving finds the one poison event among `n` with about `log2(n)`
    /// crashes before the first blame, where isolating every row would
    /// cost up to `n` claims of one suspect each after the first crash.
    #[test]
    fn halving_isolates_a_poison_row_in_logarithmic_crashes() {
        let poison = 37;
        let mut spans: std::collections::BTreeMap<i64, Option<u32>> =
            (0..64).map(|s| (s, None)).collect();
        let mut crashes = 0;
        loop {
            // The next lease takes suspects in order within the allowance;
            // it crashes only if it carries the poison row.
            let mut allowance = SuspectAllowance::default();
            let lease: Vec<(i64, Option<u32>)> = spans
                .iter()
                .filter(|(_, span)| span.is_none_or(|s| allowance.admit(s)))
                .map(|(s, span)| (*s, *span))
                .take(64)
                .collect();
            if !lease.iter().any(|(s, _)| *s == poison) {
                for (s, _) in &lease {
                    spans.remove(s);
                }
                continue;
            }
            crashes += 1;
            let verdicts = judge_crash(&lease);
            if verdicts.iter().any(|v| v.blamed) {
                assert_eq!(verdicts.iter().find(|v| v.blamed).unwrap().sequence, poison);
                break;
            }
            for v in verdicts {
                spans.insert(v.sequence, Some(v.suspect_span));
            }
        }
        assert!(
            crashes <= 8,
            "{crashes} crashes to find the poison among 64"
        );
    }
}
