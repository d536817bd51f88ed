//! Splits one publish call into waves that keep each key's order.
//!
//! Kafka orders a key's messages within one partition, so within one topic.
//! The idempotent producer (gap-less, no local timeouts: see
//! [`crate::config`]) delivers a partition's messages in order and, when one
//! fails, fails every later one too. So a key's consecutive events bound for
//! one topic (a *run*) go out together, but the key's next run, bound for
//! another topic, waits until the previous run is delivered; and a key with
//! a failure sends nothing more in the call. With one event type per key,
//! which is the common case, a whole call is one wave.

use std::collections::HashMap;

/// The runs of each key of a call, handed out wave by wave.
#[derive(Debug)]
pub(crate) struct KeyRuns {
    /// For each key, in order of first appearance: its events' indices.
    keys: Vec<KeyQueue>,
    /// The key slot of each event.
    slot_of: Vec<usize>,
}

#[derive(Debug)]
struct KeyQueue {
    events: Vec<usize>,
    /// How many of `events` were handed out.
    sent: usize,
    stopped: bool,
}

/// One key's run in a wave: events to one topic, in the key's order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Run {
    pub slot: usize,
    pub events: Vec<usize>,
}

impl KeyRuns {
    /// Plans a call whose event `i` has key `keys[i]`.
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a str>) -> Self {
        let mut slots: HashMap<&str, usize> = HashMap::new();
        let mut queues: Vec<KeyQueue> = Vec::new();
        let mut slot_of = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            let slot = *slots.entry(key).or_insert_with(|| {
                queues.push(KeyQueue {
                    events: Vec::new(),
                    sent: 0,
                    stopped: false,
                });
                queues.len() - 1
            });
            queues[slot].events.push(i);
            slot_of.push(slot);
        }
        Self {
            keys: queues,
            slot_of,
        }
    }

    /// The next wave: for every key not stopped with events left, its next
    /// run of events to one topic. Empty when the call is done.
    pub fn next_wave(&mut self, topics: &[String]) -> Vec<Run> {
        let mut wave = Vec::new();
        for (slot, key) in self.keys.iter_mut().enumerate() {
            if key.stopped || key.sent == key.events.len() {
                continue;
            }
            let topic = &topics[key.events[key.sent]];
            let run: Vec<usize> = key.events[key.sent..]
                .iter()
                .copied()
                .take_while(|&i| &topics[i] == topic)
                .collect();
            key.sent += run.len();
            wave.push(Run { slot, events: run });
        }
        wave
    }

    /// Sends nothing more of the key in `slot`.
    pub fn stop(&mut self, slot: usize) {
        self.keys[slot].stopped = true;
    }

    /// Sends nothing more of any key.
    pub fn stop_all(&mut self) {
        for key in &mut self.keys {
            key.stopped = true;
        }
    }

    /// The key slot of event `i`.
    pub fn slot_of(&self, i: usize) -> usize {
        self.slot_of[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(names: &[&str]) -> Vec<String> {
        names.iter().map(|t| t.to_string()).collect()
    }

    fn wave(runs: &mut KeyRuns, topics: &[String]) -> Vec<Vec<usize>> {
        runs.next_wave(topics)
            .into_iter()
            .map(|r| r.events)
            .collect()
    }

    #[test]
    fn one_topic_is_one_wave_whatever_the_keys() {
        let keys = ["a", "a", "b", "a", "b"];
        let topics = topics(&["t"; 5]);
        let mut runs = KeyRuns::new(keys);
        assert_eq!(wave(&mut runs, &topics), vec![vec![0, 1, 3], vec![2, 4]]);
        assert!(runs.next_wave(&topics).is_empty());
    }

    #[test]
    fn a_keys_run_to_another_topic_waits_for_the_next_wave() {
        let keys = ["a", "a", "a", "b", "a"];
        let topics = topics(&["x", "x", "y", "y", "x"]);
        let mut runs = KeyRuns::new(keys);
        assert_eq!(wave(&mut runs, &topics), vec![vec![0, 1], vec![3]]);
        assert_eq!(wave(&mut runs, &topics), vec![vec![2]]);
        assert_eq!(wave(&mut runs, &topics), vec![vec![4]]);
        assert!(runs.next_wave(&topics).is_empty());
    }

    #[test]
    fn a_stopped_key_sends_nothing_more() {
        let keys = ["a", "b", "a", "b"];
        let topics = topics(&["x", "x", "y", "y"]);
        let mut runs = KeyRuns::new(keys);
        let first = runs.next_wave(&topics);
        assert_eq!(first.len(), 2);
        runs.stop(first[0].slot);
        assert_eq!(runs.slot_of(2), first[0].slot);
        assert_eq!(wave(&mut runs, &topics), vec![vec![3]]);
        runs.stop_all();
        assert!(runs.next_wave(&topics).is_empty());
    }
}
