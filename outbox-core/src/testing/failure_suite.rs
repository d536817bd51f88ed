//! The failure suite: failure semantics every store shares (bad rows, leases,
//! failure classes), each with its fault injected through [`FaultSeams`]: hosts whose
//! clocks are off, rows other tools wrote, relays killed mid-publish,
//! duplicate ids from concurrent transactions, settlements slow to commit.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use super::fixtures::{event, events_over_keys};
use super::relay_suite::{Alerts, DEADLINE, config, start};
use super::store_suite::{LEASE, assert_published, ids, request, state};
use super::{BeginWrite, FaultSeams, StoreFactory, enqueue_all};
use crate::clock::{Clock, ManualClock, SkewedClock, add_duration};
use crate::event::EventId;
use crate::memory::{Fault, RecordingPublisher};
use crate::policy::PoisonPolicy;
use crate::store::{
    AttemptKind, ClaimedEvent, EnqueueOutcome, EventState, Heartbeat, OutboxAdmin, OutboxStore,
    OutboxWriter, RelayId,
};

/// How much a store on a real clock (the database's, shifted by the test)
/// may run ahead of the test's manual clock while one test runs.
const SLACK: Duration = Duration::from_secs(5);

async fn claim(store: &(impl OutboxStore + ?Sized), owner: &str) -> Vec<ClaimedEvent> {
    store
        .claim_batch(&request(owner, 100))
        .await
        .expect("claim")
        .events
}

/// A store of `factory` if it lets two write transactions overlap; else
/// says the test is skipped.
async fn with_overlapping_writers<F>(factory: &F) -> Option<Arc<F::Store>>
where
    F: StoreFactory,
    F::Store: FaultSeams,
{
    let store = factory.create(ManualClock::at_epoch()).await;
    if store.overlapping_writers() {
        return Some(store);
    }
    eprintln!("skipped: this store has one writer at a time");
    None
}

/// Leases, delays and backoff are measured on store time, never on a host's
/// clock: relays and producers whose clocks run five minutes ahead or behind
/// neither steal a live lease, nor hold an expired one, nor move a delay.
pub async fn leases_and_delays_follow_store_time<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: FaultSeams,
{
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let skewed = |minutes: i64| -> Arc<dyn Clock> {
        Arc::new(SkewedClock::new(
            Arc::new(clock.clone()),
            chrono::Duration::minutes(minutes),
        ))
    };
    let (ahead_clock, behind_clock) = (skewed(5), skewed(-5));
    let ahead = store.with_host_clock(ahead_clock.clone());
    let behind = store.with_host_clock(behind_clock.clone());

    // A writer ahead: "now" by its clock is not a delay.
    let e = event("a", 1);
    enqueue_all(&*ahead, std::slice::from_ref(&e)).await;
    let first = claim(&*ahead, "relay-ahead").await;
    assert_eq!(ids(&first), vec![e.event_id], "due at once on store time");
    clock.advance(LEASE - Duration::from_secs(1));
    assert!(
        claim(&*behind, "relay-behind").await.is_empty(),
        "a relay behind must not take a live lease"
    );
    assert!(
        claim(&*store, "relay-on-time").await.is_empty(),
        "a lease a relay ahead took lives its full length on store time"
    );
    clock.advance(Duration::from_secs(2));
    let again = claim(&*behind, "relay-behind").await;
    assert_eq!(
        ids(&again),
        vec![e.event_id],
        "an expired lease is expired for a relay behind too"
    );
    store
        .ack(&[again[0].lease.clone()])
        .await
        .expect("ack the re-claim");

    // Delays asked for on skewed clocks count from store time.
    let mut late = event("b", 1);
    late.available_at = Some(add_duration(ahead_clock.now(), Duration::from_secs(60)));
    let mut early = event("c", 1);
    early.available_at = Some(add_duration(behind_clock.now(), Duration::from_secs(60)));
    enqueue_all(&*ahead, std::slice::from_ref(&late)).await;
    enqueue_all(&*behind, std::slice::from_ref(&early)).await;
    assert!(
        claim(&*store, "relay-on-time").await.is_empty(),
        "a 60 s delay asked for on a clock 5 min behind is not due at once"
    );
    clock.advance(Duration::from_secs(58));
    assert!(
        claim(&*store, "relay-on-time").await.is_empty(),
        "a 60 s delay asked for on a clock 5 min ahead is not cut short"
    );
    clock.advance(Duration::from_secs(3));
    let due: HashSet<EventId> = ids(&claim(&*store, "relay-on-time").await)
        .into_iter()
        .collect();
    assert_eq!(
        due,
        HashSet::from([late.event_id, early.event_id]),
        "both due after 60 s of store time"
    );

    // Operators see each relay's skew; nothing else uses it.
    ahead
        .heartbeat(&Heartbeat::alive(RelayId::new("relay-ahead")))
        .await
        .unwrap();
    store
        .heartbeat(&Heartbeat::alive(RelayId::new("relay-on-time")))
        .await
        .unwrap();
    let relays = store.relays().await.unwrap();
    let skew = |name: &str| {
        relays
            .iter()
            .find(|r| r.relay == name)
            .expect("relay listed")
            .clock_skew
    };
    let difference = (skew("relay-ahead") - skew("relay-on-time"))
        .to_std()
        .expect("the relay ahead shows a larger skew");
    let five_minutes = Duration::from_secs(300);
    assert!(
        difference + SLACK > five_minutes && difference < five_minutes + SLACK,
        "{difference:?}"
    );
}

/// A relay or producer host whose clock steps back an hour mid-run (an NTP
/// correction, a VM restored from a snapshot) changes nothing: the lease it
/// holds keeps its store-time length and its ack lands, an event it
/// enqueues after the step is due at once, a delay it asks for after the
/// step counts from store time. (The relay keeps no wall-clock time of its
/// own: its waits are tokio's monotonic timers.)
pub async fn a_host_clock_stepping_back_changes_nothing<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: FaultSeams,
{
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let host = SkewedClock::new(Arc::new(clock.clone()), chrono::Duration::zero());
    let handle = store.with_host_clock(Arc::new(host.clone()));

    let before = event("a", 1);
    enqueue_all(&*handle, std::slice::from_ref(&before)).await;
    let held = claim(&*handle, "relay-stepping").await;
    assert_eq!(ids(&held), vec![before.event_id]);
    host.step(chrono::Duration::hours(-1));
    clock.advance(LEASE - Duration::from_secs(1));
    assert!(
        claim(&*store, "relay-other").await.is_empty(),
        "the lease lives its full store-time length after the step"
    );
    handle
        .ack(&[held[0].lease.clone()])
        .await
        .expect("the ack after the step lands");
    assert!(matches!(
        state(&*store, before.event_id).await,
        EventState::Published { .. }
    ));

    let after = event("b", 1);
    enqueue_all(&*handle, std::slice::from_ref(&after)).await;
    let due = claim(&*store, "relay-other").await;
    assert_eq!(
        ids(&due),
        vec![after.event_id],
        "an event enqueued after the step is due at once, not in an hour"
    );
    store.ack(&[due[0].lease.clone()]).await.expect("ack");

    let mut delayed = event("c", 1);
    delayed.available_at = Some(add_duration(host.now(), Duration::from_secs(60)));
    enqueue_all(&*handle, std::slice::from_ref(&delayed)).await;
    host.step(chrono::Duration::hours(-1));
    assert!(
        claim(&*handle, "relay-stepping").await.is_empty(),
        "a 60 s delay is not due at once"
    );
    clock.advance(Duration::from_secs(61));
    assert_eq!(
        ids(&claim(&*handle, "relay-stepping").await),
        vec![delayed.event_id],
        "due after 60 s of store time, however far the host clock stepped"
    );
}

/// A row the store cannot decode (another tool wrote it) fails on its own
/// with a typed reason in its history; its neighbours are published, the
/// claim never rolls back or leaves anything leased because of it, and every
/// admin read works with it present. Under `Skip` its key goes on; under
/// `Block` its key parks behind it.
pub async fn unreadable_rows_fail_alone<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: FaultSeams,
{
    for poison in [PoisonPolicy::Skip, PoisonPolicy::Block] {
        let store = factory.create(ManualClock::at_epoch()).await;
        let bad = store.write_unreadable_row("bad").await;
        let healthy = events_over_keys(10, 10);
        let behind = event("bad", 2);
        enqueue_all(&*store, &healthy).await;
        enqueue_all(&*store, std::slice::from_ref(&behind)).await;
        let mut req = request("relay-1", 100);
        req.poison = poison;

        let mut published = HashSet::new();
        let mut unreadable = Vec::new();
        for _ in 0..5 {
            let batch = store
                .claim_batch(&req)
                .await
                .expect("a bad row never fails the claim");
            unreadable.extend(
                batch
                    .unreadable
                    .iter()
                    .map(|u| (u.event.event_id, u.reason.clone())),
            );
            if batch.events.is_empty() && batch.unreadable.is_empty() {
                break;
            }
            let leases: Vec<_> = batch.events.iter().map(|c| c.lease.clone()).collect();
            published.extend(ids(&batch.events));
            store.ack(&leases).await.unwrap();
        }
        assert_eq!(unreadable.len(), 1, "{poison:?}: reported once");
        assert_eq!(unreadable[0].0, bad);
        assert!(!unreadable[0].1.is_empty(), "the reason is given");
        for e in &healthy {
            assert!(
                published.contains(&e.event_id),
                "{poison:?}: a neighbour was held back"
            );
        }
        let blocked = store.blocked_keys().await.unwrap();
        match poison {
            PoisonPolicy::Skip => {
                assert!(
                    published.contains(&behind.event_id),
                    "Skip: the key goes on"
                );
                assert!(blocked.is_empty());
            }
            PoisonPolicy::Block => {
                assert!(
                    !published.contains(&behind.event_id),
                    "Block: the key parks"
                );
                assert_eq!(blocked.len(), 1);
                assert_eq!(blocked[0].blocking_event_id, bad);
            }
        }
        assert!(matches!(
            state(&*store, bad).await,
            EventState::Failed { blocks_key, .. } if blocks_key == (poison == PoisonPolicy::Block)
        ));
        let history = store
            .history(bad)
            .await
            .expect("history with the bad row present");
        assert_eq!(history.last().unwrap().kind, AttemptKind::Unreadable);
        let failed = store
            .failed_events(10)
            .await
            .expect("failed_events with the bad row");
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].event.event_id, bad);
        let stats = store.stats().await.expect("stats with the bad row present");
        assert_eq!(stats.iter().map(|s| s.failed).sum::<u64>(), 1);
        assert_eq!(
            stats.iter().map(|s| s.in_flight).sum::<u64>(),
            0,
            "nothing left leased"
        );
        store
            .held_back()
            .await
            .expect("held_back with the bad row present");
    }
}

/// A crash is blamed on the event that caused it, never on the events that
/// shared its batches: a publisher hangs on one event, and the relay
/// publishing it is killed again and again until that event fails as a
/// crash loop; every other event is published and none fails.
pub async fn crashes_are_blamed_on_the_event_that_caused_them<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let others = events_over_keys(24, 8);
    let victim = event("victim", 0);
    enqueue_all(&*store, &others[..12]).await;
    enqueue_all(&*store, std::slice::from_ref(&victim)).await;
    enqueue_all(&*store, &others[12..]).await;
    let publisher = Arc::new(RecordingPublisher::new());
    publisher.inject(victim.event_id, Fault::Hang);
    let mut cfg = config("relay-crashy");
    cfg.batch_size = 6;
    let alerts = Alerts::default();
    let mut crashes = 0;
    loop {
        assert!(
            crashes <= 12,
            "the victim never reached the crash-loop limit"
        );
        let relay = start(store.clone(), publisher.clone(), cfg.clone(), Some(&alerts));
        let outcome = tokio::time::timeout(DEADLINE, async {
            tokio::select! {
                _ = publisher.wait_for_hangs(crashes + 1) => false,
                _ = alerts.wait_for(1) => true,
            }
        })
        .await
        .expect("the relay either hung on the victim or failed it");
        if outcome {
            relay.stop().await;
            break;
        }
        relay.crash().await;
        crashes += 1;
        clock.advance(LEASE + Duration::from_secs(1));
    }
    let relay = start(store.clone(), publisher.clone(), cfg, None);
    let expected: HashSet<EventId> = others.iter().map(|e| e.event_id).collect();
    tokio::time::timeout(
        DEADLINE,
        publisher.wait_until(|delivered| {
            let seen: HashSet<EventId> = delivered.iter().map(|e| e.event_id).collect();
            expected.is_subset(&seen)
        }),
    )
    .await
    .expect("every other event published");
    relay.stop().await;
    let failed: Vec<EventId> = store
        .failed_events(100)
        .await
        .unwrap()
        .iter()
        .map(|f| f.event.event_id)
        .collect();
    assert_eq!(failed, vec![victim.event_id], "only the victim failed");
    assert_eq!(
        store
            .history(victim.event_id)
            .await
            .unwrap()
            .last()
            .unwrap()
            .kind,
        AttemptKind::CrashLoop
    );
    assert_published(&*store, &others).await;
}

/// Two transactions enqueue the same event id at once, the second having
/// read the outbox first (its snapshot predates the first's insert): the
/// second is told `AlreadyExists`, whatever the isolation level, and one row
/// is kept.
pub async fn concurrent_duplicate_ids_are_reported<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: FaultSeams,
{
    let Some(store) = with_overlapping_writers(factory).await else {
        return;
    };
    let original = event("a", 1);
    let mut replay = event("a", 2);
    replay.event_id = original.event_id;
    let mut first = store.begin_write().await.unwrap();
    let mut second = store.begin_write().await.unwrap();
    second.read().await.unwrap();
    assert!(matches!(
        first.enqueue(original.clone()).await.unwrap(),
        EnqueueOutcome::Inserted { .. }
    ));
    // The second insert of the id waits for the first transaction.
    let racing = tokio::spawn(async move {
        let outcome = second.enqueue(replay).await;
        if outcome.is_ok() {
            second.commit().await.unwrap();
        }
        outcome
    });
    first.commit().await.unwrap();
    let outcome = tokio::time::timeout(DEADLINE, racing)
        .await
        .expect("the second enqueue finishes")
        .unwrap();
    assert_eq!(
        outcome.expect("a duplicate id is not an error"),
        EnqueueOutcome::AlreadyExists
    );
    let claimed = claim(&*store, "relay-1").await;
    assert_eq!(ids(&claimed), vec![original.event_id], "one row, the first");
    let payload: serde_json::Value = claimed[0].event.payload.deserialize().unwrap();
    assert_eq!(payload["n"], 1);
}

/// A settlement whose transaction is slow to commit delays no producer:
/// inserts of other keys and of the settled rows' keys go through while it
/// is open (no range or gap lock covers new rows).
pub async fn slow_settlements_never_block_producers<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: FaultSeams,
{
    let Some(store) = with_overlapping_writers(factory).await else {
        return;
    };
    let (a1, b1) = (event("a", 1), event("b", 1));
    enqueue_all(&*store, &[a1.clone(), b1.clone()]).await;
    let claimed = claim(&*store, "relay-1").await;
    assert_eq!(claimed.len(), 2);
    let leases: Vec<_> = claimed.iter().map(|c| c.lease.clone()).collect();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (ready, running) = tokio::sync::oneshot::channel::<()>();
    let slow = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .slow_ack(&leases, ready, released.map(drop).boxed())
                .await
        })
    };
    tokio::time::timeout(DEADLINE, running)
        .await
        .expect("the slow ack's statements ran")
        .unwrap();
    let later = [event("a", 2), event("c", 1)];
    let enqueued = tokio::time::timeout(Duration::from_secs(10), store.enqueue(&later)).await;
    let _ = release.send(());
    let report = tokio::time::timeout(DEADLINE, slow)
        .await
        .expect("the slow ack finishes")
        .unwrap()
        .unwrap();
    enqueued
        .expect("a producer waited for a settlement that was slow to commit")
        .unwrap();
    assert_eq!(report.applied, 2);
    let next: HashSet<EventId> = ids(&claim(&*store, "relay-1").await).into_iter().collect();
    assert_eq!(next, later.iter().map(|e| e.event_id).collect());
}
