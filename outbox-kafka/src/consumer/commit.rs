//! Offsets: the commit watch (rdkafka's commit callback, counted) and the
//! shutdown's confirmation that the group holds what was committed.

use std::time::Duration;

use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

/// How long a graceful shutdown keeps trying to commit the last offsets.
pub const SHUTDOWN_COMMIT_LIMIT: Duration = Duration::from_secs(15);

/// Watches offset commits: logs and counts the ones that failed (librdkafka
/// retries them with the next commit of the same partitions) and remembers
/// the highest offset the broker confirmed per partition.
#[derive(Clone, Debug, Default)]
pub struct CommitWatch {
    failed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    confirmed: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<(String, i32), i64>>>,
}

impl CommitWatch {
    /// Commits that failed so far.
    pub fn failed(&self) -> u64 {
        self.failed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The highest offset the broker confirmed for `topic`/`partition`.
    pub fn confirmed(&self, topic: &str, partition: i32) -> Option<i64> {
        let confirmed = self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
        confirmed.get(&(topic.to_owned(), partition)).copied()
    }
}

impl ClientContext for CommitWatch {}

impl ConsumerContext for CommitWatch {
    fn commit_callback(
        &self,
        result: rdkafka::error::KafkaResult<()>,
        offsets: &TopicPartitionList,
    ) {
        match result {
            Ok(()) => {
                let mut confirmed = self.confirmed.lock().unwrap_or_else(|e| e.into_inner());
                for element in offsets.elements() {
                    if let (Offset::Offset(next), Ok(())) = (element.offset(), element.error()) {
                        let entry = confirmed
                            .entry((element.topic().to_owned(), element.partition()))
                            .or_insert(next);
                        *entry = (*entry).max(next);
                    }
                }
            }
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => {
                self.failed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(%error, ?offsets, "offset commit failed; the next commit retries it");
            }
        }
    }
}

/// Whether the coordinator's `held` offsets reach every one of `wanted`.
/// Whether successful commit replies cover every offset in `wanted`.
pub(super) fn confirmed_by_callback(watch: &CommitWatch, wanted: &TopicPartitionList) -> bool {
    wanted.elements().iter().all(|w| match w.offset() {
        Offset::Offset(next) => watch
            .confirmed(w.topic(), w.partition())
            .is_some_and(|confirmed| confirmed >= next),
        _ => false,
    })
}

pub(super) fn holds(held: &TopicPartitionList, wanted: &TopicPartitionList) -> bool {
    wanted.elements().iter().all(|w| {
        held.elements().iter().any(|h| {
            h.topic() == w.topic()
                && h.partition() == w.partition()
                && match (h.offset(), w.offset()) {
                    (Offset::Offset(h), Offset::Offset(w)) => h >= w,
                    _ => false,
                }
        })
    })
}
