//! The charts' data: the store's counts sampled by the server at a fixed
//! interval and kept for an hour, so a chart shows the last hour even when
//! the page was just opened.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use outbox_core::chrono::{DateTime, Utc};
use outbox_core::store::EventTypeStats;

/// How far back the charts reach.
pub const WINDOW: Duration = Duration::from_secs(3600);

/// The counts at one moment, summed over event types.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// When the counts were read.
    pub at: DateTime<Utc>,
    /// Claimable, parked and blocked events.
    pub backlog: u64,
    /// Seconds the oldest claimable event has been due (0 when none is).
    pub oldest_age: f64,
    /// Events in flight.
    pub in_flight: u64,
    /// Failed events.
    pub failed: u64,
    /// The newest event's sequence, if the store says
    /// ([`OutboxAdmin::last_sequence`](outbox_core::OutboxAdmin::last_sequence)).
    pub written: Option<i64>,
}

impl Sample {
    /// Sums `stats` as read at `at`, beside the newest sequence `written`.
    pub fn of(stats: &[EventTypeStats], written: Option<i64>, at: DateTime<Utc>) -> Self {
        Self {
            at,
            written,
            backlog: stats
                .iter()
                .map(|s| s.claimable + s.parked + s.blocked)
                .sum(),
            oldest_age: stats
                .iter()
                .filter_map(|s| s.oldest_claimable_age)
                .map(|a| a.as_secs_f64())
                .fold(0.0, f64::max),
            in_flight: stats.iter().map(|s| s.in_flight).sum(),
            failed: stats.iter().map(|s| s.failed).sum(),
        }
    }
}

/// The last hour of samples.
#[derive(Default)]
pub struct Samples {
    kept: Mutex<VecDeque<Sample>>,
}

impl Samples {
    /// Keeps `sample`, forgetting those older than the window.
    pub fn record(&self, sample: Sample) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.push_back(sample);
        let horizon = sample.at - WINDOW;
        while kept.front().is_some_and(|s| s.at < horizon) {
            kept.pop_front();
        }
    }

    /// The samples kept, oldest first.
    pub fn all(&self) -> Vec<Sample> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter().copied().collect()
    }
}

/// Events published per second between samples, as (seconds before
/// `now`, rate): what was written meanwhile (the newest sequence's rise)
/// less what the open events (backlog, in flight, failed) grew by. Pairs
/// without a sequence, or where it fell (the newest row purged), are left
/// out.
pub fn published_per_second(samples: &[Sample], now: DateTime<Utc>) -> Vec<(f64, f64)> {
    samples
        .windows(2)
        .filter_map(|pair| {
            let (before, after) = (&pair[0], &pair[1]);
            let written = after.written? - before.written?;
            let seconds = (after.at - before.at).num_milliseconds() as f64 / 1000.0;
            if written < 0 || seconds <= 0.0 {
                return None;
            }
            let open = |s: &Sample| (s.backlog + s.in_flight + s.failed) as i64;
            let published = (written - (open(after) - open(before))).max(0);
            let ago = (now - after.at).num_milliseconds().max(0) as f64 / 1000.0;
            Some((ago, published as f64 / seconds))
        })
        .collect()
}

/// Events that became failed per minute, by the minute they were seen in
/// (requeues lower the count; only rises are counted), oldest first, as
/// (minutes before `now`, count).
pub fn failures_per_minute(samples: &[Sample], now: DateTime<Utc>) -> Vec<(f64, f64)> {
    let mut minutes = std::collections::BTreeMap::<i64, u64>::new();
    for pair in samples.windows(2) {
        let rise = pair[1].failed.saturating_sub(pair[0].failed);
        let minute = (now - pair[1].at).num_seconds() / 60;
        *minutes.entry(minute).or_default() += rise;
    }
    minutes
        .into_iter()
        .rev()
        .map(|(minute, n)| (minute as f64, n as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    fn sample(seconds: i64, failed: u64) -> Sample {
        Sample {
            at: at(seconds),
            backlog: 0,
            oldest_age: 0.0,
            in_flight: 0,
            failed,
            written: None,
        }
    }

    #[test]
    fn published_is_what_was_written_less_what_stayed_open() {
        let open = |seconds, backlog, written| Sample {
            backlog,
            written,
            ..sample(seconds, 0)
        };
        let samples = [
            open(0, 100, Some(1_000)),
            open(10, 150, Some(1_200)), // 200 written, backlog +50: 150 published in 10 s
            open(20, 0, Some(1_200)),   // none written, backlog -150: 150 published
            open(30, 0, Some(900)),     // the newest row purged: left out
            open(40, 0, None),          // no sequence: left out
        ];
        assert_eq!(
            published_per_second(&samples, at(40)),
            [(30.0, 15.0), (20.0, 15.0)]
        );
    }

    #[test]
    fn samples_older_than_an_hour_are_forgotten() {
        let samples = Samples::default();
        samples.record(sample(0, 0));
        samples.record(sample(1800, 0));
        samples.record(sample(3601, 0));
        let kept = samples.all();
        assert_eq!(
            kept.iter().map(|s| s.at).collect::<Vec<_>>(),
            [at(1800), at(3601)]
        );
    }

    #[test]
    fn failures_count_rises_only_by_the_minute() {
        let samples = [
            sample(0, 0),
            sample(10, 3),  // +3, 110 s before now: minute 1
            sample(20, 1),  // requeued: not a failure
            sample(70, 4),  // +3, 50 s before now: minute 0
            sample(100, 6), // +2, minute 0
        ];
        assert_eq!(
            failures_per_minute(&samples, at(120)),
            [(1.0, 3.0), (0.0, 5.0)]
        );
    }

    #[test]
    fn counts_are_summed_over_types() {
        let stats = [
            EventTypeStats {
                event_type: "a".into(),
                claimable: 2,
                parked: 1,
                blocked: 1,
                oldest_claimable_age: Some(Duration::from_secs(5)),
                in_flight: 3,
                failed: 1,
            },
            EventTypeStats {
                event_type: "b".into(),
                claimable: 1,
                oldest_claimable_age: Some(Duration::from_secs(9)),
                failed: 2,
                ..Default::default()
            },
        ];
        let sample = Sample::of(&stats, Some(7), at(0));
        assert_eq!(
            (
                sample.backlog,
                sample.oldest_age,
                sample.in_flight,
                sample.failed
            ),
            (5, 9.0, 3, 3)
        );
    }
}
