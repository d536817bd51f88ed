//! [`MemoryStore`]: the reference implementation of the store traits.

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::watch;

use super::state::{RowStatus, State};
use crate::clock::{Clock, SystemClock, elapsed_between};
use crate::error::StoreError;
use crate::event::{EventId, EventLimits, NewEvent};
use crate::relay::WakeUp;
use crate::store::Heartbeat;
use crate::store::{
    ClaimRequest, ClaimedBatch, EnqueueOutcome, EventState, Lease, Nack, OutboxStore, OutboxWriter,
    RelayOutage, RelayStatus, Release, SettleReport,
};

/// An outbox held in memory, with the same semantics as the SQL stores.
/// Clones share the same rows.
///
/// For unit tests of code that enqueues and relays, and as the executable
/// reference the conformance suites are checked against.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    pub(super) state: Arc<Mutex<State>>,
    /// Store time: every lease, delay and age is measured on it.
    pub(super) clock: Arc<dyn Clock>,
    /// This handle's host clock: only turns an absolute `available_at`
    /// into a delay from "now" (as SQL stores do against the database clock).
    host_clock: Arc<dyn Clock>,
    limits: EventLimits,
    enqueued: Arc<watch::Sender<u64>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the system clock with default limits.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// A store on `clock` (e.g. a [`crate::ManualClock`]).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            state: Arc::default(),
            host_clock: clock.clone(),
            clock,
            limits: EventLimits::default(),
            enqueued: Arc::new(watch::channel(0).0),
        }
    }

    /// Replaces the enqueue limits.
    pub fn with_limits(mut self, limits: EventLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Another handle on the same rows whose host clock is `host_clock`:
    /// store time stays the store's (tests of clock skew between hosts).
    pub fn with_host_clock(&self, host_clock: Arc<dyn Clock>) -> Self {
        Self {
            host_clock,
            ..self.clone()
        }
    }

    /// An event as stored: an absolute `available_at` read on this handle's
    /// host clock becomes the same delay from store time.
    pub(super) fn on_store_time(&self, mut event: NewEvent) -> NewEvent {
        if let Some(at) = event.available_at {
            let delay = elapsed_between(at, self.host_clock.now());
            event.available_at = Some(crate::clock::add_duration(self.clock.now(), delay));
        }
        event
    }

    /// Writes a row that does not decode, as another tool could (test seam
    /// for "bad rows fail alone"); returns its id.
    pub fn write_unreadable_row(&self, partition_key: &str, reason: &str) -> EventId {
        let event = NewEvent::builder("bad.row", "bad", partition_key)
            .event_id(EventId::random())
            .payload(&serde_json::json!({}))
            .build()
            .expect("a valid event");
        let id = event.event_id;
        let now = self.clock.now();
        {
            let mut state = self.lock();
            let sequence = state.reserve_sequence();
            state.insert(sequence, sequence, event, now);
            state
                .rows
                .get_mut(&sequence)
                .expect("just inserted")
                .unreadable = Some(reason.into());
        }
        self.notify_enqueued();
        id
    }

    /// A wake-up that fires whenever events are committed to this store.
    pub fn wake_up(&self) -> MemoryWakeUp {
        MemoryWakeUp(self.enqueued.subscribe())
    }

    /// Opens a write transaction: events enqueued in it take their sequence
    /// now but become visible only at commit, like rows of an open database
    /// transaction. Dropping it rolls back.
    pub fn begin_write(&self) -> MemoryWriteTx {
        MemoryWriteTx {
            store: self.clone(),
            staged: Vec::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("memory store lock poisoned")
    }

    pub(super) fn validate(&self, events: &[NewEvent]) -> Result<(), StoreError> {
        for event in events {
            self.limits.check(event)?;
        }
        Ok(())
    }

    pub(super) fn notify_enqueued(&self) {
        self.enqueued.send_modify(|n| *n += 1);
    }

    /// A receiver that changes whenever a write transaction commits or rolls back.
    #[cfg(feature = "testing")]
    pub(crate) fn writes(&self) -> watch::Receiver<u64> {
        self.enqueued.subscribe()
    }
}

/// Wakes a relay when events are committed to a [`MemoryStore`].
#[derive(Debug)]
pub struct MemoryWakeUp(watch::Receiver<u64>);

#[async_trait]
impl WakeUp for MemoryWakeUp {
    async fn wait(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// An open write transaction on a [`MemoryStore`]; see [`MemoryStore::begin_write`].
#[derive(Debug)]
pub struct MemoryWriteTx {
    pub(crate) store: MemoryStore,
    staged: Vec<(i64, NewEvent)>,
}

impl MemoryWriteTx {
    /// Stages `event`, taking its sequence now. Invalid events are refused.
    pub fn enqueue(&mut self, event: NewEvent) -> Result<(), StoreError> {
        self.store.validate(std::slice::from_ref(&event))?;
        let mut state = self.store.lock();
        let sequence = state.reserve_sequence();
        state.open_writes.insert(sequence);
        state.staged_ids.entry(event.event_id).or_insert(sequence);
        self.staged.push((sequence, event));
        Ok(())
    }

    /// Makes the staged events visible, in one step.
    pub fn commit(mut self) -> Vec<EnqueueOutcome> {
        let staged = std::mem::take(&mut self.staged);
        let now = self.store.clock.now();
        let outcomes = {
            let mut state = self.store.lock();
            staged
                .into_iter()
                .map(|(sequence, event)| {
                    state.open_writes.remove(&sequence);
                    if state.staged_ids.get(&event.event_id) == Some(&sequence) {
                        state.staged_ids.remove(&event.event_id);
                    }
                    let event = self.store.on_store_time(event);
                    state.insert(sequence, sequence, event, now)
                })
                .collect()
        };
        self.store.notify_enqueued();
        outcomes
    }
}

impl MemoryWriteTx {
    #[cfg(feature = "testing")]
    /// Whether another open write transaction has staged `event_id`: as a
    /// database's unique key would, a second insert of it waits for that
    /// transaction to end.
    pub(crate) fn staged_elsewhere(&self, event_id: EventId) -> bool {
        let mine: std::collections::HashSet<i64> = self.staged.iter().map(|(s, _)| *s).collect();
        self.store
            .lock()
            .staged_ids
            .get(&event_id)
            .is_some_and(|sequence| !mine.contains(sequence))
    }

    /// Whether `event_id` is committed already.
    #[cfg(feature = "testing")]
    pub(crate) fn committed(&self, event_id: EventId) -> bool {
        self.store.lock().ids.contains_key(&event_id)
    }
}

impl Drop for MemoryWriteTx {
    fn drop(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        {
            let mut state = self.store.lock();
            for (sequence, event) in &self.staged {
                state.open_writes.remove(sequence);
                state.staged_ids.remove(&event.event_id);
            }
        }
        self.store.notify_enqueued();
    }
}

#[async_trait]
impl OutboxWriter for MemoryStore {
    async fn enqueue(&self, events: &[NewEvent]) -> Result<Vec<EnqueueOutcome>, StoreError> {
        self.validate(events)?;
        let now = self.clock.now();
        let outcomes = {
            let mut state = self.lock();
            events
                .iter()
                .map(|event| {
                    let sequence = state.reserve_sequence();
                    state.insert(sequence, sequence, self.on_store_time(event.clone()), now)
                })
                .collect()
        };
        self.notify_enqueued();
        Ok(outcomes)
    }
}

#[async_trait]
impl OutboxStore for MemoryStore {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        let now = self.clock.now();
        Ok(self.lock().claim(request, now))
    }

    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let mut report = SettleReport::default();
        for lease in leases {
            match state.leased_row(lease) {
                Some(row) => {
                    row.status = RowStatus::Published { at: now };
                    row.unfinished_claims = 0;
                    row.suspect_span = None;
                    report.applied += 1;
                }
                None => report.fenced.push(lease.event_id),
            }
        }
        Ok(report)
    }

    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let mut report = SettleReport::default();
        for nack in nacks {
            let owner = match state.rows.get(&nack.lease.sequence).map(|r| &r.status) {
                Some(RowStatus::InFlight { owner, .. }) => owner.to_string(),
                _ => String::new(),
            };
            match state.leased_row(&nack.lease) {
                Some(row) => {
                    State::apply_nack(
                        row,
                        &nack.action,
                        nack.error_class,
                        &nack.error,
                        &owner,
                        now,
                    );
                    report.applied += 1;
                }
                None => report.fenced.push(nack.lease.event_id),
            }
        }
        Ok(report)
    }

    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        let mut state = self.lock();
        let mut report = SettleReport::default();
        let mut started: std::collections::BTreeMap<u64, Vec<i64>> = Default::default();
        for release in releases {
            match state.leased_row(&release.lease) {
                Some(row) => {
                    if release.attempt_started
                        && let RowStatus::InFlight { lease, .. } = row.status
                    {
                        started.entry(lease).or_default().push(row.stored.sequence);
                    }
                    row.status = RowStatus::Pending;
                    report.applied += 1;
                }
                None => report.fenced.push(release.lease.event_id),
            }
        }
        // Rows whose publishing had started are blamed as after a crash.
        for rows in started.values() {
            state.blame(rows);
        }
        drop(state);
        if report.applied > 0 {
            self.notify_enqueued();
        }
        Ok(report)
    }

    async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        let now = self.clock.now();
        let skew = (self.host_clock.now() - now).num_milliseconds();
        let mut state = self.lock();
        let since = state
            .relays
            .get(&beat.relay)
            .and_then(|r| r.outage.as_ref())
            .map_or(now, |o| o.since);
        let status = RelayStatus {
            relay: beat.relay.to_string(),
            last_seen: now,
            clock_skew: chrono::Duration::milliseconds(skew),
            outage: beat.outage.as_ref().map(|o| RelayOutage {
                destination: o.destination.clone(),
                reason: o.reason.clone(),
                since,
            }),
        };
        state.relays.insert(beat.relay.clone(), status);
        Ok(())
    }
}

pub(super) fn state_of(
    status: &RowStatus,
    available_at: chrono::DateTime<chrono::Utc>,
    attempts: u32,
) -> EventState {
    match status {
        RowStatus::Pending => EventState::Pending {
            available_at,
            attempts,
        },
        RowStatus::InFlight {
            owner,
            lease_expires_at,
            ..
        } => EventState::InFlight {
            owner: owner.to_string(),
            lease_expires_at: *lease_expires_at,
        },
        RowStatus::Published { at } => EventState::Published { published_at: *at },
        RowStatus::Failed {
            blocks_key,
            superseded_by,
        } => EventState::Failed {
            blocks_key: *blocks_key,
            superseded_by: *superseded_by,
        },
    }
}
