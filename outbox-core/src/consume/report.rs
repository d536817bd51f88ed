//! What a consumer runner did, returned when it stops: the counts every
//! runner keeps, with its broker's own beside them.

/// How a runner finished one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handled {
    /// The effect committed with the inbox claim.
    Applied,
    /// A redelivery the inbox recognised: acknowledged without effect.
    Duplicate,
    /// Given up on and written to the dead letters.
    DeadLettered,
    /// Shutdown came first: nothing stored nor acknowledged, so the broker
    /// delivers it again later.
    Interrupted,
}

/// What a consumer did, returned when it stops: the counts every runner
/// keeps, and the broker's own in `broker` (Kafka's rebalances, Redis'
/// reclaimed entries, SQS's visibility extensions).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerReport<B> {
    /// Effects committed.
    pub applied: u64,
    /// Redeliveries the inbox recognised (acknowledged without effect).
    pub duplicates: u64,
    /// Messages written to the dead letters (a dead-letter topic, stream
    /// or queue).
    pub dead_lettered: u64,
    /// Retryable inbox-store errors ridden out on the message in hand.
    pub store_retries: u64,
    /// The broker's own counts.
    pub broker: B,
}

impl<B> ConsumerReport<B> {
    /// Counts how a message ended; `false` when shutdown interrupted it
    /// (the runner stops without acknowledging it).
    pub fn count(&mut self, handled: Handled) -> bool {
        match handled {
            Handled::Applied => self.applied += 1,
            Handled::Duplicate => self.duplicates += 1,
            Handled::DeadLettered => self.dead_lettered += 1,
            Handled::Interrupted => return false,
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_end_is_counted_once_and_an_interruption_stops_the_runner() {
        let mut report = ConsumerReport::<()>::default();
        let ends = [
            Handled::Applied,
            Handled::Applied,
            Handled::Duplicate,
            Handled::DeadLettered,
        ];
        assert!(ends.into_iter().all(|end| report.count(end)));
        assert!(!report.count(Handled::Interrupted));
        assert_eq!(
            (report.applied, report.duplicates, report.dead_lettered),
            (2, 1, 1)
        );
    }
}
