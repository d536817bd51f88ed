//! [`MemoryStore`] as an operator reads and mends it: stats, held back,
//! failed events and their history, requeue, skip, supersede, purge.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::state::{Row, RowStatus, State};
use crate::clock::elapsed_between;
use crate::error::StoreError;
use crate::event::{EventId, NewEvent};
use crate::store::{
    AttemptKind, AttemptRecord, BlockedKey, EnqueueOutcome, EventState, EventTypeStats,
    FailedEvent, HeldBack, OperatorAction, OutboxAdmin, RelayStatus,
};

use super::store::{MemoryStore, state_of};

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
        self.operator_change(event_id, action, AttemptKind::Requeued, |row, now| {
            row.status = RowStatus::Pending;
            row.stored.attempts = 0;
            row.stored.available_at = now;
        })
    }

    async fn skip(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        self.operator_change(event_id, action, AttemptKind::Skipped, |row, _| {
            if let RowStatus::Failed { blocks_key, .. } = &mut row.status {
                *blocks_key = false;
            }
        })
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

    async fn last_sequence(&self) -> Result<Option<i64>, StoreError> {
        Ok(self
            .lock()
            .rows
            .values()
            .map(|row| row.stored.sequence)
            .max())
    }
}

impl MemoryStore {
    /// Changes a failed row as an operator asked (`change`, at the store's
    /// now), records the action in its history and wakes the relays.
    fn operator_change(
        &self,
        event_id: EventId,
        action: &OperatorAction,
        kind: AttemptKind,
        change: impl FnOnce(&mut Row, DateTime<Utc>),
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        {
            let mut state = self.lock();
            let row = failed_row(&mut state, event_id)?;
            change(row, now);
            row.record(kind, now, &action.operator, None, &action.reason);
        }
        self.notify_enqueued();
        Ok(())
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
