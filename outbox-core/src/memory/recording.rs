//! [`RecordingPublisher`]: records what it publishes and fails on cue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::event::{EventId, StoredEvent};
use crate::publisher::{
    ErrorClass, PublishError, PublishOutcome, Publisher, PublisherCapabilities,
};

/// A scripted fault for one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fail the next `n` attempts with this class, then succeed.
    FailTimes(ErrorClass, u32),
    /// Fail every attempt with this class.
    FailAlways(ErrorClass),
    /// Deliver the event, then never return: a relay that dies after
    /// publishing and before acknowledging.
    DeliverThenHang,
    /// Never return and deliver nothing: a relay that dies mid-publish.
    Hang,
}

#[derive(Debug, Default)]
struct Script {
    faults: HashMap<EventId, Fault>,
    outage: bool,
    delivered: Vec<StoredEvent>,
    calls: usize,
    hangs: usize,
}

/// An in-process broker for tests and examples: records every delivered
/// event in order, and fails on cue (per-event faults, a broker-wide outage).
/// Clones share one recording.
#[derive(Clone, Debug, Default)]
pub struct RecordingPublisher {
    script: Arc<Mutex<Script>>,
    delivered: Arc<Notify>,
    capabilities: PublisherCapabilities,
}

impl RecordingPublisher {
    /// A publisher that delivers everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Overrides the declared capabilities.
    pub fn with_capabilities(mut self, capabilities: PublisherCapabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Script> {
        self.script.lock().expect("publisher lock")
    }

    /// Scripts a fault for `event_id`, replacing any earlier one.
    pub fn inject(&self, event_id: EventId, fault: Fault) {
        self.lock().faults.insert(event_id, fault);
    }

    /// Removes the fault for `event_id`.
    pub fn clear(&self, event_id: EventId) {
        self.lock().faults.remove(&event_id);
    }

    /// While on, every event fails with [`ErrorClass::Outage`].
    pub fn set_outage(&self, on: bool) {
        self.lock().outage = on;
    }

    /// Everything delivered so far, in delivery order.
    pub fn delivered(&self) -> Vec<StoredEvent> {
        self.lock().delivered.clone()
    }

    /// Ids delivered so far, in delivery order.
    pub fn delivered_ids(&self) -> Vec<EventId> {
        self.lock().delivered.iter().map(|e| e.event_id).collect()
    }

    /// Number of `publish` calls so far.
    pub fn calls(&self) -> usize {
        self.lock().calls
    }

    /// Waits until `pred` holds for the delivered events. Returns as soon as
    /// a delivery makes it true; never sleeps.
    pub async fn wait_until(&self, pred: impl Fn(&[StoredEvent]) -> bool) {
        self.wait_for(|state| pred(&state.delivered)).await;
    }

    /// Waits until `publish` was called at least `n` times (the call may
    /// still be in progress, e.g. hanging on a scripted fault).
    pub async fn wait_for_calls(&self, n: usize) {
        self.wait_for(|state| state.calls >= n).await;
    }

    /// Waits until `n` calls have hung on a scripted fault (a relay stuck
    /// mid-publish, ready to be killed).
    pub async fn wait_for_hangs(&self, n: usize) {
        self.wait_for(|state| state.hangs >= n).await;
    }

    /// Waits until `pred` holds for the recorded state, woken by each call
    /// (every call notifies, delivered or not).
    async fn wait_for(&self, pred: impl Fn(&Script) -> bool) {
        loop {
            let notified = self.delivered.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if pred(&self.lock()) {
                return;
            }
            notified.await;
        }
    }

    /// Waits until at least `n` events were delivered.
    pub async fn wait_for_deliveries(&self, n: usize) {
        self.wait_until(|d| d.len() >= n).await;
    }
}

enum Step {
    Outcome(PublishOutcome),
    Hang,
}

#[async_trait]
impl Publisher for RecordingPublisher {
    fn capabilities(&self) -> PublisherCapabilities {
        self.capabilities
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut hang = false;
        {
            let mut script = self.lock();
            script.calls += 1;
            for event in batch {
                let step = if script.outage {
                    Step::Outcome(Err(PublishError::outage("broker unreachable (injected)")))
                } else {
                    match script.faults.get_mut(&event.event_id) {
                        None => Step::Outcome(Ok(())),
                        Some(Fault::FailTimes(class, n)) if *n > 0 => {
                            *n -= 1;
                            Step::Outcome(Err(PublishError::new(*class, "injected failure")))
                        }
                        Some(Fault::FailTimes(..)) => Step::Outcome(Ok(())),
                        Some(Fault::FailAlways(class)) => {
                            Step::Outcome(Err(PublishError::new(*class, "injected failure")))
                        }
                        Some(Fault::DeliverThenHang) => {
                            script.delivered.push((*event).clone());
                            Step::Hang
                        }
                        Some(Fault::Hang) => Step::Hang,
                    }
                };
                match step {
                    Step::Outcome(outcome) => {
                        if outcome.is_ok() {
                            script.delivered.push((*event).clone());
                        }
                        outcomes.push(outcome);
                    }
                    Step::Hang => {
                        hang = true;
                        script.hangs += 1;
                        break;
                    }
                }
            }
        }
        self.delivered.notify_waiters();
        if hang {
            std::future::pending::<()>().await;
        }
        outcomes
    }
}
