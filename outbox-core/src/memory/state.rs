//! The in-memory store's rows and the row state machine over them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};

use crate::clock::add_duration;
use crate::event::{EventId, NewEvent, StoredEvent};
use crate::policy::{Ordering, PoisonPolicy};
use crate::publisher::ErrorClass;
use crate::store::{
    AttemptKind, AttemptRecord, ClaimRequest, ClaimedBatch, ClaimedEvent, EnqueueOutcome,
    FailReason, FencingToken, Lease, NackAction, RelayId, RelayStatus, SuspectAllowance,
};

#[derive(Clone, Debug)]
pub(super) enum RowStatus {
    Pending,
    InFlight {
        owner: RelayId,
        lease_expires_at: DateTime<Utc>,
        /// The claim that leased it: rows of one lease share a crash.
        lease: u64,
    },
    Published {
        at: DateTime<Utc>,
    },
    Failed {
        blocks_key: bool,
        superseded_by: Option<EventId>,
    },
}

#[derive(Clone, Debug)]
pub(super) struct Row {
    pub(super) stored: StoredEvent,
    /// Place in the key's order; equals `sequence` except for a replacement,
    /// which takes the place of the event it supersedes.
    pub(super) position: i64,
    pub(super) status: RowStatus,
    pub(super) fencing_token: i64,
    /// Crashes blamed on this row alone; a crash-looping event piles them up.
    pub(super) unfinished_claims: u32,
    /// It shared a lease that ended without an outcome: until it settles, a
    /// lease carries at most this many suspects with it
    /// ([`crate::store::judge_crash`]).
    pub(super) suspect_span: Option<u32>,
    /// Set by tests: the row does not decode (as a row written by another
    /// tool may not); the claim fails it alone.
    pub(super) unreadable: Option<String>,
    pub(super) history: Vec<AttemptRecord>,
}

impl Row {
    /// Holds back later events of its key under per-key ordering.
    fn is_unsettled(&self) -> bool {
        match self.status {
            RowStatus::Pending | RowStatus::InFlight { .. } => true,
            RowStatus::Failed { blocks_key, .. } => blocks_key,
            RowStatus::Published { .. } => false,
        }
    }

    /// May be leased now (ignoring the key's order).
    fn is_claimable(&self, now: DateTime<Utc>) -> bool {
        match &self.status {
            RowStatus::Pending => self.stored.available_at <= now,
            RowStatus::InFlight {
                lease_expires_at, ..
            } => *lease_expires_at <= now,
            _ => false,
        }
    }

    pub(super) fn record(
        &mut self,
        kind: AttemptKind,
        at: DateTime<Utc>,
        actor: &str,
        error_class: Option<ErrorClass>,
        detail: &str,
    ) {
        self.history.push(AttemptRecord {
            kind,
            at,
            actor: actor.to_owned(),
            error_class,
            detail: detail.to_owned(),
            attempts: self.stored.attempts,
        });
    }
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) rows: BTreeMap<i64, Row>,
    pub(super) ids: HashMap<EventId, i64>,
    next_sequence: i64,
    /// Sequences reserved by write transactions that have not committed: no
    /// row above the lowest of them is claimed, since a lower sequence of the
    /// same key may still commit.
    pub(super) open_writes: BTreeSet<i64>,
    /// Each relay's last heartbeat: store time, skew in ms, outage.
    pub(super) relays: BTreeMap<RelayId, RelayStatus>,
    /// Leases younger than one of their owner's that expired: prefetched,
    /// never published (see `reap`).
    pub(super) unstarted_leases: std::collections::HashSet<u64>,
    /// Event ids staged by open write transactions, with the staging sequence.
    pub(super) staged_ids: HashMap<EventId, i64>,
    next_lease: u64,
}

impl State {
    pub(super) fn reserve_sequence(&mut self) -> i64 {
        self.next_sequence += 1;
        self.next_sequence
    }

    /// Inserts a validated event under `sequence` unless its id exists.
    pub(super) fn insert(
        &mut self,
        sequence: i64,
        position: i64,
        event: NewEvent,
        now: DateTime<Utc>,
    ) -> EnqueueOutcome {
        if self.ids.contains_key(&event.event_id) {
            return EnqueueOutcome::AlreadyExists;
        }
        self.ids.insert(event.event_id, sequence);
        let available_at = event.available_at.unwrap_or(now);
        self.rows.insert(
            sequence,
            Row {
                stored: StoredEvent {
                    sequence,
                    event,
                    created_at: now,
                    available_at,
                    attempts: 0,
                },
                position,
                status: RowStatus::Pending,
                fencing_token: 0,
                unfinished_claims: 0,
                suspect_span: None,
                unreadable: None,
                history: Vec::new(),
            },
        );
        EnqueueOutcome::Inserted { sequence }
    }

    pub(super) fn row_by_id(&mut self, event_id: EventId) -> Option<&mut Row> {
        let sequence = *self.ids.get(&event_id)?;
        self.rows.get_mut(&sequence)
    }

    pub(super) fn claim(&mut self, request: &ClaimRequest, now: DateTime<Utc>) -> ClaimedBatch {
        self.reap(now);
        let horizon = self.open_writes.first().copied().unwrap_or(i64::MAX);
        let mut batch = ClaimedBatch::default();
        let chosen = match request.ordering {
            Ordering::PerKey => self.choose_per_key(request, now, horizon, &mut batch),
            Ordering::Unordered => self.choose_unordered(request, now, horizon, &mut batch),
        };
        let lease_expires_at = add_duration(now, request.lease_duration);
        self.next_lease += 1;
        let lease = self.next_lease;
        for sequence in chosen {
            let row = self.rows.get_mut(&sequence).expect("chosen row exists");
            row.fencing_token += 1;
            row.status = RowStatus::InFlight {
                owner: request.owner.clone(),
                lease_expires_at,
                lease,
            };
            batch.events.push(ClaimedEvent {
                event: row.stored.clone(),
                lease: Lease {
                    sequence,
                    event_id: row.stored.event_id,
                    fencing_token: FencingToken(row.fencing_token),
                    lease_expires_at,
                },
            });
        }
        batch
    }

    /// Leases that expired with rows in flight: the rows go back to pending
    /// and the crash is blamed (see [`State::blame`]).
    ///
    /// A relay publishes its leases one at a time, in claim order, and
    /// claims the next while publishing (prefetch): of one owner's leases
    /// still holding rows, only the oldest can have started publishing. A
    /// younger one is unstarted; its rows go back unblamed, and once an
    /// older lease of its owner is reaped it stays marked so.
    fn reap(&mut self, now: DateTime<Utc>) {
        let mut held: BTreeMap<u64, (RelayId, bool, Vec<i64>)> = BTreeMap::new();
        for row in self.rows.values() {
            if let RowStatus::InFlight {
                lease_expires_at,
                lease,
                ref owner,
            } = row.status
            {
                held.entry(lease)
                    .or_insert_with(|| (owner.clone(), lease_expires_at <= now, Vec::new()))
                    .2
                    .push(row.stored.sequence);
            }
        }
        let mut older_owners: std::collections::HashSet<RelayId> = Default::default();
        let mut reaped_owners: std::collections::HashSet<RelayId> = Default::default();
        for (lease, (owner, expired, rows)) in &held {
            let unstarted = self.unstarted_leases.contains(lease) || older_owners.contains(owner);
            older_owners.insert(owner.clone());
            if !*expired {
                if reaped_owners.contains(owner) {
                    self.unstarted_leases.insert(*lease);
                }
                continue;
            }
            reaped_owners.insert(owner.clone());
            if unstarted {
                for sequence in rows {
                    self.rows.get_mut(sequence).expect("row exists").status = RowStatus::Pending;
                }
            } else {
                self.blame(rows);
            }
            self.unstarted_leases.remove(lease);
        }
    }

    /// Rows of one lease ended without an outcome after publishing may have
    /// started: back to pending, judged by [`crate::store::judge_crash`]
    /// (blamed where it is certain which row crashed, suspects otherwise).
    pub(super) fn blame(&mut self, sequences: &[i64]) {
        let rows: Vec<(i64, Option<u32>)> = sequences
            .iter()
            .map(|s| (*s, self.rows[s].suspect_span))
            .collect();
        for verdict in crate::store::judge_crash(&rows) {
            let row = self.rows.get_mut(&verdict.sequence).expect("row exists");
            row.status = RowStatus::Pending;
            row.suspect_span = Some(verdict.suspect_span);
            if verdict.blamed {
                row.unfinished_claims += 1;
            }
        }
    }

    /// Fails `sequence` on its own if it cannot be published: it has been
    /// claimed too often without an outcome (a crash loop), or it does not
    /// decode. Returns true if it did.
    fn fail_if_unpublishable(
        &mut self,
        sequence: i64,
        request: &ClaimRequest,
        now: DateTime<Utc>,
        batch: &mut ClaimedBatch,
    ) -> bool {
        let row = self.rows.get_mut(&sequence).expect("row exists");
        let (kind, detail) = if row.unfinished_claims >= request.crash_loop_limit {
            let detail = format!(
                "{} publish attempts started and none finished",
                row.unfinished_claims
            );
            row.unfinished_claims = 0;
            row.suspect_span = None;
            batch.crash_looped.push(row.stored.clone());
            (AttemptKind::CrashLoop, detail)
        } else if let Some(reason) = row.unreadable.clone() {
            batch.unreadable.push(crate::event::UnreadableEvent {
                event: row.stored.clone(),
                reason: reason.clone(),
            });
            (AttemptKind::Unreadable, reason)
        } else {
            return false;
        };
        row.status = RowStatus::Failed {
            blocks_key: request.poison == PoisonPolicy::Block,
            superseded_by: None,
        };
        row.record(kind, now, request.owner.as_str(), None, &detail);
        true
    }

    fn choose_per_key(
        &mut self,
        request: &ClaimRequest,
        now: DateTime<Utc>,
        horizon: i64,
        batch: &mut ClaimedBatch,
    ) -> Vec<i64> {
        // Unsettled rows of each key in key order; keys ordered by their head.
        let mut unsettled: Vec<(i64, i64)> = self
            .rows
            .values()
            .filter(|r| r.is_unsettled())
            .map(|r| (r.position, r.stored.sequence))
            .collect();
        unsettled.sort_unstable();
        let keys: Vec<Vec<i64>> = {
            let mut key_index: HashMap<&str, usize> = HashMap::new();
            let mut keys: Vec<Vec<i64>> = Vec::new();
            for (_, sequence) in &unsettled {
                let key = self.rows[sequence].stored.partition_key.as_str();
                let index = *key_index.entry(key).or_insert_with(|| {
                    keys.push(Vec::new());
                    keys.len() - 1
                });
                keys[index].push(*sequence);
            }
            keys
        };

        // Per key, the claimable prefix: stop at the first row that is
        // leased, parked, blocking, or above the commit horizon.
        let mut prefixes: Vec<Vec<i64>> = Vec::with_capacity(keys.len());
        for rows in keys {
            let mut prefix = Vec::new();
            for sequence in rows {
                let row = &self.rows[&sequence];
                if sequence > horizon || !row.is_claimable(now) {
                    break;
                }
                if self.fail_if_unpublishable(sequence, request, now, batch) {
                    if request.poison == PoisonPolicy::Block {
                        break;
                    }
                    continue;
                }
                prefix.push(sequence);
            }
            if !prefix.is_empty() {
                prefixes.push(prefix);
            }
        }

        // Round-robin over keys so a batch spans as many keys as it can: the
        // relay publishes a key's events one after another, keys side by side.
        // Crash suspects only within their span: a key stops at one refused.
        let mut chosen = Vec::with_capacity(request.limit);
        let mut suspects = SuspectAllowance::default();
        let mut stopped = vec![false; prefixes.len()];
        let mut depth = 0;
        while chosen.len() < request.limit {
            let mut took = false;
            for (k, prefix) in prefixes.iter().enumerate() {
                if stopped[k] {
                    continue;
                }
                if let Some(sequence) = prefix.get(depth) {
                    if let Some(span) = self.rows[sequence].suspect_span {
                        if !suspects.admit(span) {
                            stopped[k] = true;
                            continue;
                        }
                    }
                    chosen.push(*sequence);
                    took = true;
                    if chosen.len() == request.limit {
                        break;
                    }
                }
            }
            if !took {
                break;
            }
            depth += 1;
        }
        // A later row of a key is never chosen without the earlier ones,
        // because depth d is filled for every key before depth d+1.
        chosen
    }

    fn choose_unordered(
        &mut self,
        request: &ClaimRequest,
        now: DateTime<Utc>,
        horizon: i64,
        batch: &mut ClaimedBatch,
    ) -> Vec<i64> {
        let candidates: Vec<i64> = self
            .rows
            .values()
            .filter(|r| r.stored.sequence <= horizon && r.is_claimable(now))
            .map(|r| r.stored.sequence)
            .collect();
        let mut chosen = Vec::new();
        let mut suspects = SuspectAllowance::default();
        for sequence in candidates {
            if chosen.len() == request.limit {
                break;
            }
            if self.fail_if_unpublishable(sequence, request, now, batch) {
                continue;
            }
            if let Some(span) = self.rows[&sequence].suspect_span {
                if !suspects.admit(span) {
                    continue;
                }
            }
            chosen.push(sequence);
        }
        chosen
    }

    /// The row under `lease` if the lease still holds it (token matches and
    /// nobody settled it since).
    pub(super) fn leased_row(&mut self, lease: &Lease) -> Option<&mut Row> {
        let row = self.rows.get_mut(&lease.sequence)?;
        let held = matches!(row.status, RowStatus::InFlight { .. })
            && row.fencing_token == lease.fencing_token.0;
        held.then_some(row)
    }

    pub(super) fn apply_nack(
        row: &mut Row,
        action: &NackAction,
        class: ErrorClass,
        error: &str,
        actor: &str,
        now: DateTime<Utc>,
    ) {
        row.stored.attempts += 1;
        row.unfinished_claims = 0;
        row.suspect_span = None;
        let kind = match action {
            NackAction::Retry { after } => {
                row.stored.available_at = add_duration(now, *after);
                row.status = RowStatus::Pending;
                AttemptKind::TransientFailure
            }
            NackAction::Fail { reason, block_key } => {
                row.status = RowStatus::Failed {
                    blocks_key: *block_key,
                    superseded_by: None,
                };
                match reason {
                    FailReason::Permanent => AttemptKind::PermanentFailure,
                    FailReason::AttemptsExhausted => AttemptKind::AttemptsExhausted,
                }
            }
        };
        row.record(kind, now, actor, Some(class), error);
    }
}
