//! [`MemoryStore`]: the reference implementation of the store traits.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use super::state::{RowStatus, State};
use crate::clock::{Clock, SystemClock, elapsed_between};
use crate::error::StoreError;
use crate::event::{EventId, EventLimits, NewEvent};
use crate::relay::WakeUp;
use crate::store::Heartbeat;
use crate::store::{
    AttemptKind, AttemptRecord, BlockedKey, ClaimRequest, ClaimedBatch, EnqueueOutcome, EventState,
    EventTypeStats, FailedEvent, HeldBack, Lease, Nack, OperatorAction, OutboxAdmin, OutboxStore,
    OutboxWriter, RelayOutage, RelayStatus, Release, SettleReport,
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

    fn validate(&self, events: &[NewEvent]) -> Result<(), StoreError> {
        for event in events {
            self.limits.check(event)?;
        }
        Ok(())
    }

    fn notify_enqueued(&self) {
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

fn state_of(
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

#[async_trait]
impl OutboxAdmin for MemoryStore {
    async fn stats(&self) -> Result<Vec<EventTypeStats>, StoreError> {
        let now = self.clock.now();
        let state = self.lock();
        let mut by_type: std::collections::BTreeMap<&str, EventTypeStats> = Default::default();
        // Each blocked key's first blocking failed row, in claim order.
        let mut blocked_from: std::collections::HashMap<&str, (i64, i64)> = Default::default();
        for row in state.rows.values() {
            if let RowStatus::Failed {
                blocks_key: true, ..
            } = row.status
            {
                let at = (row.position, row.stored.sequence);
                let first = blocked_from
                    .entry(row.stored.partition_key.as_str())
                    .or_insert(at);
                *first = (*first).min(at);
            }
        }
        for row in state.rows.values() {
            let stats = by_type
                .entry(row.stored.event_type.as_str())
                .or_insert_with(|| EventTypeStats {
                    event_type: row.stored.event_type.clone(),
                    ..EventTypeStats::default()
                });
            let behind_a_block = blocked_from
                .get(row.stored.partition_key.as_str())
                .is_some_and(|at| (row.position, row.stored.sequence) > *at);
            match row.status {
                RowStatus::Pending if behind_a_block => stats.blocked += 1,
                RowStatus::Pending if row.stored.available_at <= now => {
                    stats.claimable += 1;
                    let age = elapsed_between(now, row.stored.available_at);
                    stats.oldest_claimable_age = stats.oldest_claimable_age.max(Some(age));
                }
                RowStatus::Pending => stats.parked += 1,
                RowStatus::InFlight { .. } => stats.in_flight += 1,
                RowStatus::Failed { .. } => stats.failed += 1,
                RowStatus::Published { .. } => {}
            }
        }
        Ok(by_type.into_values().collect())
    }

    async fn held_back(&self) -> Result<Vec<HeldBack>, StoreError> {
        let now = self.clock.now();
        let state = self.lock();
        let mut rows: Vec<_> = state.rows.values().collect();
        rows.sort_by_key(|r| (r.position, r.stored.sequence));
        // Per key, the first row that holds the rest back, and the count behind it.
        let mut heads: std::collections::HashMap<&str, (&super::state::Row, u64)> =
            Default::default();
        let mut expired: std::collections::BTreeMap<u64, (u64, chrono::DateTime<chrono::Utc>)> =
            Default::default();
        let mut suspects = 0;
        for row in &rows {
            let key = row.stored.partition_key.as_str();
            if let Some((_, behind)) = heads.get_mut(key) {
                if matches!(row.status, RowStatus::Pending) {
                    *behind += 1;
                }
            } else {
                let holds = match row.status {
                    RowStatus::Pending => row.stored.available_at > now,
                    RowStatus::Failed { blocks_key, .. } => blocks_key,
                    _ => false,
                };
                if holds {
                    heads.insert(key, (row, 1));
                } else if !matches!(
                    row.status,
                    RowStatus::Published { .. } | RowStatus::Failed { .. }
                ) {
                    heads.insert(key, (row, 0));
                }
            }
            if let RowStatus::InFlight {
                lease_expires_at,
                lease,
                ..
            } = row.status
                && lease_expires_at <= now
            {
                let entry = expired.entry(lease).or_insert((0, lease_expires_at));
                entry.0 += 1;
            }
            if row.suspect_span.is_some() && matches!(row.status, RowStatus::Pending) {
                suspects += 1;
            }
        }
        let mut held = Vec::new();
        let blocked: Vec<_> = heads
            .values()
            .filter(|(r, _)| matches!(r.status, RowStatus::Failed { .. }))
            .collect();
        if !blocked.is_empty() {
            held.push(HeldBack::BlockedKeys {
                keys: blocked.len() as u64,
                waiting: blocked.iter().map(|(_, n)| n - 1).sum(),
            });
        }
        let waiting: Vec<_> = heads
            .values()
            .filter(|(r, n)| *n > 0 && matches!(r.status, RowStatus::Pending))
            .collect();
        if let Some(next_due) = waiting.iter().map(|(r, _)| r.stored.available_at).min() {
            held.push(HeldBack::BackingOff {
                keys: waiting.len() as u64,
                waiting: waiting.iter().map(|(_, n)| n).sum(),
                next_due,
            });
        }
        if let Some(first_expired_at) = expired.values().map(|(_, at)| *at).min() {
            held.push(HeldBack::ExpiredLeases {
                leases: expired.len() as u64,
                events: expired.values().map(|(n, _)| n).sum(),
                first_expired_at,
            });
        }
        if suspects > 0 {
            held.push(HeldBack::CrashSuspects { events: suspects });
        }
        Ok(held)
    }

    async fn event_state(&self, event_id: EventId) -> Result<Option<EventState>, StoreError> {
        let mut state = self.lock();
        Ok(state
            .row_by_id(event_id)
            .map(|row| state_of(&row.status, row.stored.available_at, row.stored.attempts)))
    }

    async fn failed_events(&self, limit: usize) -> Result<Vec<FailedEvent>, StoreError> {
        let state = self.lock();
        Ok(state
            .rows
            .values()
            .filter_map(|row| match &row.status {
                RowStatus::Failed {
                    blocks_key,
                    superseded_by,
                } => Some(FailedEvent {
                    event: row.stored.clone(),
                    blocks_key: *blocks_key,
                    superseded_by: *superseded_by,
                    history: row.history.clone(),
                }),
                _ => None,
            })
            .take(limit)
            .collect())
    }

    async fn history(&self, event_id: EventId) -> Result<Vec<AttemptRecord>, StoreError> {
        let mut state = self.lock();
        let row = state
            .row_by_id(event_id)
            .ok_or(StoreError::NotFound(event_id))?;
        Ok(row.history.clone())
    }

    async fn blocked_keys(&self) -> Result<Vec<BlockedKey>, StoreError> {
        let state = self.lock();
        let mut blocked: Vec<BlockedKey> = Vec::new();
        let mut rows: Vec<_> = state.rows.values().collect();
        rows.sort_by_key(|r| (r.position, r.stored.sequence));
        for row in rows {
            let key = &row.stored.partition_key;
            if let Some(entry) = blocked.iter_mut().find(|b| &b.partition_key == key) {
                if matches!(row.status, RowStatus::Pending) {
                    entry.backlog += 1;
                }
                continue;
            }
            if let RowStatus::Failed {
                blocks_key: true, ..
            } = row.status
            {
                blocked.push(BlockedKey {
                    partition_key: key.clone(),
                    blocking_event_id: row.stored.event_id,
                    backlog: 0,
                });
            }
        }
        Ok(blocked)
    }

    async fn requeue(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        let now = self.clock.now();
        {
            let mut state = self.lock();
            let row = failed_row(&mut state, event_id)?;
            row.status = RowStatus::Pending;
            row.stored.attempts = 0;
            row.stored.available_at = now;
            row.record(
                AttemptKind::Requeued,
                now,
                &action.operator,
                None,
                &action.reason,
            );
        }
        self.notify_enqueued();
        Ok(())
    }

    async fn skip(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        let now = self.clock.now();
        {
            let mut state = self.lock();
            let row = failed_row(&mut state, event_id)?;
            if let RowStatus::Failed { blocks_key, .. } = &mut row.status {
                *blocks_key = false;
            }
            row.record(
                AttemptKind::Skipped,
                now,
                &action.operator,
                None,
                &action.reason,
            );
        }
        self.notify_enqueued();
        Ok(())
    }

    async fn supersede(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        self.validate(std::slice::from_ref(&replacement))?;
        let now = self.clock.now();
        let outcome = {
            let mut state = self.lock();
            let position = failed_row(&mut state, event_id)?.position;
            let replacement_id = replacement.event_id;
            let sequence = state.reserve_sequence();
            let outcome = state.insert(sequence, position, replacement, now);
            if outcome == EnqueueOutcome::AlreadyExists {
                return Ok(outcome);
            }
            let row = failed_row(&mut state, event_id)?;
            row.status = RowStatus::Failed {
                blocks_key: false,
                superseded_by: Some(replacement_id),
            };
            let detail = format!("superseded by {replacement_id}: {}", action.reason);
            row.record(
                AttemptKind::Superseded,
                now,
                &action.operator,
                None,
                &detail,
            );
            outcome
        };
        self.notify_enqueued();
        Ok(outcome)
    }

    async fn purge_published(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let doomed: Vec<(i64, EventId)> = state
            .rows
            .values()
            .filter(|row| match row.status {
                RowStatus::Published { at } => elapsed_between(now, at) >= older_than,
                _ => false,
            })
            .take(batch_size)
            .map(|row| (row.stored.sequence, row.stored.event_id))
            .collect();
        for (sequence, event_id) in &doomed {
            state.rows.remove(sequence);
            state.ids.remove(event_id);
        }
        Ok(doomed.len() as u64)
    }

    async fn relays(&self) -> Result<Vec<RelayStatus>, StoreError> {
        Ok(self.lock().relays.values().cloned().collect())
    }
}

fn failed_row(state: &mut State, event_id: EventId) -> Result<&mut super::state::Row, StoreError> {
    let row = state
        .row_by_id(event_id)
        .ok_or(StoreError::NotFound(event_id))?;
    match row.status {
        RowStatus::Failed {
            superseded_by: None,
            ..
        } => Ok(row),
        _ => Err(StoreError::WrongState {
            event_id,
            actual: state_of(&row.status, row.stored.available_at, row.stored.attempts).name(),
            expected: "failed (not superseded)",
        }),
    }
}
