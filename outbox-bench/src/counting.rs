//! A publisher that delivers nowhere and counts, so a drain measures the
//! outbox and nothing else; optionally wrapping a real publisher.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use outbox_core::event::StoredEvent;
use outbox_core::{EventId, PublishOutcome, Publisher, PublisherCapabilities};
use tokio::sync::Notify;

/// Counts successful deliveries and wakes a waiter at a target count.
pub struct CountingPublisher<P = NoBroker> {
    inner: P,
    delivered: AtomicU64,
    target: AtomicU64,
    reached: Notify,
    max_batch: usize,
    /// When set, the instant each event id was first delivered.
    arrivals: Option<Mutex<HashMap<EventId, Instant>>>,
}

/// The no-op broker: every publish succeeds at once.
pub struct NoBroker;

#[async_trait]
impl Publisher for NoBroker {
    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        batch.iter().map(|_| Ok(())).collect()
    }
}

/// A broker that keeps each key's order (Kafka, Redis Streams) and takes
/// `round_trip` per publish call: the relay then sends a key's run in one
/// call, and a hot key's drain costs what a real broker's round trips cost.
pub struct KeyOrderBroker {
    /// What one publish call costs.
    pub round_trip: std::time::Duration,
}

#[async_trait]
impl Publisher for KeyOrderBroker {
    fn capabilities(&self) -> PublisherCapabilities {
        PublisherCapabilities {
            max_batch: 256,
            preserves_key_order: true,
        }
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        tokio::time::sleep(self.round_trip).await;
        batch.iter().map(|_| Ok(())).collect()
    }
}

impl CountingPublisher<NoBroker> {
    /// A no-op publisher taking batches of up to `max_batch`.
    pub fn noop(max_batch: usize) -> Self {
        Self::wrapping(NoBroker, max_batch)
    }
}

impl<P: Publisher> CountingPublisher<P> {
    /// Counts what `inner` accepted.
    pub fn wrapping(inner: P, max_batch: usize) -> Self {
        Self {
            inner,
            delivered: AtomicU64::new(0),
            target: AtomicU64::new(u64::MAX),
            reached: Notify::new(),
            max_batch,
            arrivals: None,
        }
    }

    /// Also records when each event id arrived (latency runs).
    pub fn recording_arrivals(mut self) -> Self {
        self.arrivals = Some(Mutex::new(HashMap::new()));
        self
    }

    /// Successful deliveries so far (duplicates included).
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::SeqCst)
    }

    /// Waits until at least `count` deliveries have succeeded.
    pub async fn wait_for(&self, count: u64) {
        self.target.store(count, Ordering::SeqCst);
        loop {
            let notified = self.reached.notified();
            if self.delivered() >= count {
                return;
            }
            notified.await;
        }
    }

    /// First-arrival instants recorded so far.
    pub fn take_arrivals(&self) -> HashMap<EventId, Instant> {
        self.arrivals
            .as_ref()
            .map(|a| std::mem::take(&mut *a.lock().expect("arrivals lock")))
            .unwrap_or_default()
    }
}

#[async_trait]
impl<P: Publisher> Publisher for CountingPublisher<P> {
    fn capabilities(&self) -> PublisherCapabilities {
        PublisherCapabilities {
            max_batch: self.max_batch,
            preserves_key_order: self.inner.capabilities().preserves_key_order,
        }
    }

    fn destination(&self) -> String {
        self.inner.destination()
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let started = Instant::now();
        let outcomes = self.inner.publish(batch).await;
        let now = Instant::now();
        crate::publish_trace::record(started, now, batch);
        if let Some(arrivals) = &self.arrivals {
            let mut arrivals = arrivals.lock().expect("arrivals lock");
            for (event, outcome) in batch.iter().zip(&outcomes) {
                if outcome.is_ok() {
                    arrivals.entry(event.event_id).or_insert(now);
                }
            }
        }
        let ok = outcomes.iter().filter(|o| o.is_ok()).count() as u64;
        let total = self.delivered.fetch_add(ok, Ordering::SeqCst) + ok;
        if total >= self.target.load(Ordering::SeqCst) {
            self.reached.notify_waiters();
        }
        outcomes
    }
}
