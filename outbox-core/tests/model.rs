//! Property test: random interleavings of enqueue, open write transactions,
//! claim, publish outcomes, settlement, relay crashes and clock jumps against
//! the in-memory store never lose a committed event and never publish a key
//! out of order.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use outbox_core::memory::{MemoryStore, MemoryWriteTx};
use outbox_core::publisher::ErrorClass;
use outbox_core::store::{
    ClaimRequest, ClaimedEvent, EventState, FailReason, Lease, Nack, NackAction, OutboxAdmin,
    OutboxStore, OutboxWriter, RelayId, Release,
};
use outbox_core::testing::event;
use outbox_core::{Clock, EventId, ManualClock, Ordering, PoisonPolicy};
use proptest::prelude::*;

const LEASE: Duration = Duration::from_secs(10);
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);
const MAX_ATTEMPTS: u32 = 3;
const RELAYS: usize = 3;
const WRITERS: usize = 2;

#[derive(Clone, Debug)]
enum Outcome {
    Ok,
    Transient { backoff_secs: u8 },
    Permanent,
}

#[derive(Clone, Debug)]
enum Op {
    Enqueue { key: u8 },
    Begin { writer: usize },
    Write { writer: usize, key: u8 },
    Commit { writer: usize },
    Rollback { writer: usize },
    Claim { relay: usize, limit: usize },
    Publish { relay: usize, outcome: Outcome },
    Settle { relay: usize },
    Crash { relay: usize },
    Advance { secs: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    let outcome = prop_oneof![
        6 => Just(Outcome::Ok),
        2 => (0u8..15).prop_map(|backoff_secs| Outcome::Transient { backoff_secs }),
        1 => Just(Outcome::Permanent),
    ];
    prop_oneof![
        4 => (0u8..4).prop_map(|key| Op::Enqueue { key }),
        1 => (0..WRITERS).prop_map(|writer| Op::Begin { writer }),
        2 => ((0..WRITERS), 0u8..4).prop_map(|(writer, key)| Op::Write { writer, key }),
        1 => (0..WRITERS).prop_map(|writer| Op::Commit { writer }),
        1 => (0..WRITERS).prop_map(|writer| Op::Rollback { writer }),
        3 => ((0..RELAYS), 1usize..6).prop_map(|(relay, limit)| Op::Claim { relay, limit }),
        6 => ((0..RELAYS), outcome).prop_map(|(relay, outcome)| Op::Publish { relay, outcome }),
        2 => (0..RELAYS).prop_map(|relay| Op::Settle { relay }),
        1 => (0..RELAYS).prop_map(|relay| Op::Crash { relay }),
        2 => (0u8..20).prop_map(|secs| Op::Advance { secs }),
    ]
}

#[derive(Clone, Debug)]
enum Decision {
    Ack,
    Nack(NackAction, ErrorClass),
}

/// A relay reduced to its protocol with the store, as the real one runs it.
#[derive(Default)]
struct ModelRelay {
    held: Vec<ClaimedEvent>,
    decisions: Vec<Option<Decision>>,
    stopped_keys: HashSet<String>,
    abandoned: bool,
}

struct World {
    store: MemoryStore,
    clock: ManualClock,
    relays: Vec<ModelRelay>,
    writers: Vec<Option<(MemoryWriteTx, Vec<EventId>)>>,
    committed: HashSet<EventId>,
    rolled_back: HashSet<EventId>,
    /// The broker: (key, sequence, id) in publication order.
    log: Vec<(String, i64, EventId)>,
    counter: usize,
}

impl World {
    fn new() -> Self {
        let clock = ManualClock::at_epoch();
        Self {
            store: MemoryStore::with_clock(Arc::new(clock.clone())),
            clock,
            relays: (0..RELAYS).map(|_| ModelRelay::default()).collect(),
            writers: (0..WRITERS).map(|_| None).collect(),
            committed: HashSet::new(),
            rolled_back: HashSet::new(),
            log: Vec::new(),
            counter: 0,
        }
    }

    fn next_event(&mut self, key: u8) -> outbox_core::NewEvent {
        self.counter += 1;
        event(&format!("k{key}"), self.counter)
    }

    fn request(relay: usize, limit: usize) -> ClaimRequest {
        ClaimRequest {
            owner: RelayId::new(format!("r{relay}")),
            limit,
            lease_duration: LEASE,
            ordering: Ordering::PerKey,
            poison: PoisonPolicy::Skip,
            crash_loop_limit: 3,
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Enqueue { key } => {
                let e = self.next_event(*key);
                block_on(self.store.enqueue(std::slice::from_ref(&e))).unwrap();
                self.committed.insert(e.event_id);
            }
            Op::Begin { writer } => {
                if self.writers[*writer].is_none() {
                    self.writers[*writer] = Some((self.store.begin_write(), Vec::new()));
                }
            }
            Op::Write { writer, key } => {
                let e = self.next_event(*key);
                if let Some((tx, ids)) = self.writers[*writer].as_mut() {
                    ids.push(e.event_id);
                    tx.enqueue(e).unwrap();
                }
            }
            Op::Commit { writer } => {
                if let Some((tx, ids)) = self.writers[*writer].take() {
                    tx.commit();
                    self.committed.extend(ids);
                }
            }
            Op::Rollback { writer } => {
                if let Some((tx, ids)) = self.writers[*writer].take() {
                    drop(tx);
                    self.rolled_back.extend(ids);
                }
            }
            Op::Claim { relay, limit } => {
                if self.relays[*relay].held.is_empty() {
                    let batch =
                        block_on(self.store.claim_batch(&Self::request(*relay, *limit))).unwrap();
                    let r = &mut self.relays[*relay];
                    r.decisions = vec![None; batch.events.len()];
                    r.held = batch.events;
                    r.stopped_keys.clear();
                    r.abandoned = false;
                }
            }
            Op::Publish { relay, outcome } => self.publish(*relay, outcome),
            Op::Settle { relay } => self.settle(*relay),
            Op::Crash { relay } => self.relays[*relay] = ModelRelay::default(),
            Op::Advance { secs } => self.clock.advance(Duration::from_secs(u64::from(*secs))),
        }
    }

    fn publish(&mut self, relay: usize, outcome: &Outcome) {
        let now = self.clock.now();
        let r = &mut self.relays[relay];
        if r.abandoned {
            return;
        }
        let Some(i) = (0..r.held.len()).find(|&i| {
            r.decisions[i].is_none() && !r.stopped_keys.contains(&r.held[i].event.partition_key)
        }) else {
            return;
        };
        // The real relay's guard: an attempt must end before the lease can.
        let deadline = r.held[i].lease.lease_expires_at;
        if now + chrono::Duration::from_std(PUBLISH_TIMEOUT).unwrap() > deadline {
            r.abandoned = true;
            return;
        }
        let claimed = &r.held[i];
        let key = claimed.event.partition_key.clone();
        let attempts = claimed.event.attempts + 1;
        let decision = match outcome {
            Outcome::Ok => {
                self.log
                    .push((key, claimed.lease.sequence, claimed.event.event_id));
                Decision::Ack
            }
            Outcome::Transient { .. } if attempts >= MAX_ATTEMPTS => {
                r.stopped_keys.insert(key);
                let action = NackAction::Fail {
                    reason: FailReason::AttemptsExhausted,
                    block_key: false,
                };
                Decision::Nack(action, ErrorClass::Transient)
            }
            Outcome::Transient { backoff_secs } => {
                r.stopped_keys.insert(key);
                let after = Duration::from_secs(u64::from(*backoff_secs));
                Decision::Nack(NackAction::Retry { after }, ErrorClass::Transient)
            }
            Outcome::Permanent => {
                r.stopped_keys.insert(key);
                let action = NackAction::Fail {
                    reason: FailReason::Permanent,
                    block_key: false,
                };
                Decision::Nack(action, ErrorClass::Permanent)
            }
        };
        r.decisions[i] = Some(decision);
    }

    fn settle(&mut self, relay: usize) {
        let r = std::mem::take(&mut self.relays[relay]);
        let mut acks: Vec<Lease> = Vec::new();
        let mut nacks = Vec::new();
        let mut releases = Vec::new();
        for (claimed, decision) in r.held.into_iter().zip(r.decisions) {
            match decision {
                Some(Decision::Ack) => acks.push(claimed.lease),
                Some(Decision::Nack(action, error_class)) => nacks.push(Nack {
                    lease: claimed.lease,
                    action,
                    error_class,
                    error: "model".into(),
                }),
                None => releases.push(Release {
                    lease: claimed.lease,
                    attempt_started: false,
                }),
            }
        }
        block_on(self.store.ack(&acks)).unwrap();
        block_on(self.store.nack(&nacks)).unwrap();
        block_on(self.store.release(&releases)).unwrap();
    }

    /// Every relay crashes, open writers commit, then a healthy relay drains.
    fn drain(&mut self) {
        for relay in 0..RELAYS {
            self.apply(&Op::Crash { relay });
        }
        for writer in 0..WRITERS {
            self.apply(&Op::Commit { writer });
        }
        for _ in 0..50 {
            self.clock.advance(Duration::from_secs(1000));
            self.apply(&Op::Claim {
                relay: 0,
                limit: 10_000,
            });
            if self.relays[0].held.is_empty() {
                return;
            }
            for _ in 0..self.relays[0].held.len() {
                self.apply(&Op::Publish {
                    relay: 0,
                    outcome: Outcome::Ok,
                });
            }
            self.apply(&Op::Settle { relay: 0 });
        }
        panic!("drain did not converge");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn never_loses_an_event_nor_breaks_key_order(ops in proptest::collection::vec(op(), 1..120)) {
        let mut world = World::new();
        for op in &ops {
            world.apply(op);
        }
        world.drain();

        let published: HashSet<EventId> = world.log.iter().map(|(_, _, id)| *id).collect();
        for id in &world.committed {
            let state = block_on(world.store.event_state(*id)).unwrap();
            match state {
                Some(EventState::Published { .. }) => {
                    prop_assert!(published.contains(id), "{id} acknowledged but never reached the broker");
                }
                Some(EventState::Failed { .. }) => {
                    let history = block_on(world.store.history(*id)).unwrap();
                    prop_assert!(!history.is_empty(), "{id} failed without a recorded reason");
                }
                other => prop_assert!(false, "committed event {id} left as {other:?}"),
            }
        }
        for id in &world.rolled_back {
            prop_assert!(!published.contains(id), "rolled-back {id} was published");
            prop_assert_eq!(block_on(world.store.event_state(*id)).unwrap(), None);
        }
        // What a consumer deduplicating by event id (the inbox) sees: each
        // event's first publication. Per key those follow sequence order.
        // Redeliveries after a crash or an expired lease repeat events that
        // were already published, never one that was not.
        let mut first_seen = HashSet::new();
        let mut last_by_key: HashMap<&str, i64> = HashMap::new();
        for (key, sequence, id) in &world.log {
            if !first_seen.insert(*id) {
                continue;
            }
            let last = last_by_key.entry(key.as_str()).or_insert(*sequence);
            prop_assert!(*sequence >= *last, "key {key}: {id} (seq {sequence}) first published after seq {last}");
            *last = *sequence;
        }
    }
}
