//! When to claim the next batch while the current one is published.

/// Most full batches published without prefetching after claims beside a
/// batch kept coming back empty.
const MAX_SKIP: u32 = 64;

/// Decides, per full batch, whether to claim the next one meanwhile.
///
/// With per-key order, a claim made beside a batch finds nothing when that
/// batch holds every key with pending events (one key, a handful, a bulk
/// import for one tenant): the store reads the backlog only to skip it, on
/// the cores the publisher needs. After such an empty claim the relay skips
/// prefetching for 1, then 2, 4 … up to 64 full batches, then tries again;
/// a prefetch that finds events resets it.
#[derive(Debug)]
pub(super) struct PrefetchGate {
    enabled: bool,
    skip: u32,
    backoff: u32,
}

impl PrefetchGate {
    pub(super) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            skip: 0,
            backoff: 0,
        }
    }

    /// Whether to prefetch beside a batch of which `full` says whether the
    /// claim filled it (a short batch means the store had no more).
    pub(super) fn should_prefetch(&mut self, full: bool) -> bool {
        if !self.enabled || !full {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// What a prefetched claim found.
    pub(super) fn prefetched(&mut self, found_events: bool) {
        if found_events {
            self.backoff = 0;
        } else {
            self.backoff = (self.backoff * 2).clamp(1, MAX_SKIP);
            self.skip = self.backoff;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(gate: &mut PrefetchGate, batches: usize, finds: bool) -> String {
        (0..batches)
            .map(|_| {
                if gate.should_prefetch(true) {
                    gate.prefetched(finds);
                    'P'
                } else {
                    '.'
                }
            })
            .collect()
    }

    #[test]
    fn empty_prefetches_back_off_and_useful_ones_reset() {
        let mut gate = PrefetchGate::new(true);
        assert_eq!(pattern(&mut gate, 12, false), "P.P..P....P.");
        gate.prefetched(true);
        gate.skip = 0;
        assert_eq!(pattern(&mut gate, 3, true), "PPP");
    }

    #[test]
    fn backoff_is_capped() {
        let mut gate = PrefetchGate::new(true);
        let run = pattern(&mut gate, 1_000, false);
        let longest_gap = run.split('P').map(str::len).max().unwrap_or(0);
        assert_eq!(longest_gap, MAX_SKIP as usize);
    }

    #[test]
    fn never_beside_a_short_batch_or_when_turned_off() {
        let mut gate = PrefetchGate::new(true);
        assert!(!gate.should_prefetch(false));
        let mut off = PrefetchGate::new(false);
        assert!(!off.should_prefetch(true));
    }
}
