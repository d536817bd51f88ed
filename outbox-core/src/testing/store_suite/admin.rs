//! The store suite, what operators read and keep: purge, stats, status
//! and heartbeats.

use super::*;

/// Purge deletes only published rows older than the cut-off, in bounded batches.
pub async fn purge_never_touches_unpublished_rows<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let events = events_over_keys(12, 12);
    enqueue_all(&*store, &events).await;
    let claimed = claim(&*store, &request("r1", 12)).await;
    store
        .ack(
            &claimed[..5]
                .iter()
                .map(|c| c.lease.clone())
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    store
        .nack(&[fail(&claimed[5], false), fail(&claimed[6], true)])
        .await
        .unwrap();
    store
        .nack(&[retry(&claimed[7], Duration::from_secs(1))])
        .await
        .unwrap();
    store
        .release(&[Release {
            lease: claimed[8].lease.clone(),
            attempt_started: false,
        }])
        .await
        .unwrap();
    // claimed[9..] stay in flight; events published now are too young to purge.
    assert_eq!(
        store
            .purge_published(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    clock.advance(Duration::from_secs(7200));
    let mut purged = 0;
    loop {
        let n = store
            .purge_published(Duration::from_secs(3600), 2)
            .await
            .unwrap();
        assert!(n <= 2, "a purge batch is bounded");
        if n == 0 {
            break;
        }
        purged += n;
    }
    assert_eq!(purged, 5);
    for c in &claimed[..5] {
        assert_eq!(store.event_state(c.event.event_id).await.unwrap(), None);
    }
    for c in &claimed[5..] {
        assert!(
            store.event_state(c.event.event_id).await.unwrap().is_some(),
            "unpublished row purged"
        );
    }
}

/// Purge keeps its contract however the history was made: a call returns
/// fewer than `batch_size` only when nothing the cut-off allows is left, so
/// "call again while it returns `batch_size`" empties the history. Events
/// are published one per claim (on PostgreSQL each is a claim-order run of
/// its own, the shape live traffic leaves), some after a retry (written
/// published), and the batch is larger than any internal read.
pub async fn purge_empties_the_history_while_it_returns_batch_size<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let req = request("r1", 16);
    let mut published = Vec::new();
    for n in 0..300usize {
        let e = event(&format!("k{}", n % 7), n);
        enqueue_all(&*store, std::slice::from_ref(&e)).await;
        let mut c = claim(&*store, &req).await;
        if n % 10 == 0 {
            // A retry first: the row leaves claim order and is written
            // published when acked.
            store.nack(&[retry(&c[0], Duration::ZERO)]).await.unwrap();
            c = claim(&*store, &req).await;
        }
        store.ack(&[c[0].lease.clone()]).await.unwrap();
        published.push(e.event_id);
    }
    let pending = event("late", 1);
    enqueue_all(&*store, std::slice::from_ref(&pending)).await;
    clock.advance(Duration::from_secs(7200));
    let (mut purged, mut calls) = (0, 0);
    loop {
        let n = store
            .purge_published(Duration::from_secs(3600), 100)
            .await
            .unwrap();
        assert!(n <= 100, "a purge batch is bounded: {n}");
        purged += n;
        calls += 1;
        if n < 100 {
            break;
        }
    }
    assert_eq!(
        purged,
        300,
        "the documented loop stopped after {calls} calls with {} published events left",
        300 - purged
    );
    for id in published {
        assert_eq!(
            store.event_state(id).await.unwrap(),
            None,
            "{id} not purged"
        );
    }
    assert!(store.event_state(pending.event_id).await.unwrap().is_some());
}

/// Stats count claimable events and the age of the oldest, parked apart.
pub async fn stats_report_lag_and_parked_events<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let mut refund = event("b", 9);
    refund.event_type = "invoice.refunded".into();
    enqueue_all(
        &*store,
        &[event("a", 1), event("a", 2), event("c", 3), refund],
    )
    .await;
    clock.advance(Duration::from_secs(5));
    let c = claim(&*store, &request("r1", 1)).await;
    store
        .nack(&[retry(&c[0], Duration::from_secs(60))])
        .await
        .unwrap();
    let _in_flight = claim(&*store, &request("r2", 1)).await;
    let stats: HashMap<String, _> = store
        .stats()
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.event_type.clone(), s))
        .collect();
    let paid = &stats["invoice.paid"];
    assert_eq!(
        (paid.claimable, paid.parked, paid.in_flight, paid.failed),
        (1, 1, 1, 0),
        "{paid:?}"
    );
    // Store time: a database clock also moved while the test ran.
    let age = paid.oldest_claimable_age.expect("an age");
    assert!(
        age >= Duration::from_secs(5) && age < Duration::from_secs(5) + SLACK,
        "{age:?}"
    );
    let refunded = &stats["invoice.refunded"];
    assert_eq!(
        (refunded.claimable, refunded.in_flight),
        (1, 0),
        "{refunded:?}"
    );
}

/// `stats`, `held_back` and `blocked_keys` agree with each other and with
/// the rows, in every situation at once: a key blocked by a failed event
/// with events behind it (blocked: neither claimable nor in the lag), a
/// key in retry backoff and one delayed (parked, the due events behind
/// them counted claimable and as waiting on the backoff), a key with a
/// batch in flight, and a free key.
pub async fn status_adds_up<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let (b1, r1, f1) = (event("blk", 1), event("retry", 1), event("fly", 1));
    enqueue_all(&*store, &[b1.clone(), r1.clone(), f1.clone()]).await;
    let mut blocking = request("r1", 10);
    blocking.poison = PoisonPolicy::Block;
    let first = claim(&*store, &blocking).await;
    assert_eq!(first.len(), 3);
    let of = |id: EventId| first.iter().find(|c| c.event.event_id == id).unwrap();
    store
        .nack(&[
            fail(of(b1.event_id), true),
            retry(of(r1.event_id), Duration::from_secs(60)),
        ])
        .await
        .unwrap();
    // f1 stays in flight.
    let mut blocked_type = event("blk", 2);
    blocked_type.event_type = "invoice.voided".into();
    let mut delayed = event("delay", 1);
    delayed.available_at = Some(clock.now_plus(Duration::from_secs(120)));
    let behind = [
        blocked_type,
        event("blk", 3),
        event("retry", 2),
        event("fly", 2),
        delayed,
        event("delay", 2),
        event("free", 1),
    ];
    enqueue_all(&*store, &behind).await;
    clock.advance(Duration::from_secs(5));

    let stats = store.stats().await.unwrap();
    let total = |f: fn(&crate::store::EventTypeStats) -> u64| stats.iter().map(f).sum::<u64>();
    assert_eq!(
        (
            total(|s| s.claimable),
            total(|s| s.parked),
            total(|s| s.blocked),
            total(|s| s.in_flight),
            total(|s| s.failed)
        ),
        // claimable: retry 2, fly 2, delay 2, free 1; parked: retry 1,
        // delay 1; blocked: blk 2 (voided) and blk 3; in flight: fly 1;
        // failed: blk 1.
        (4, 2, 2, 1, 1),
        "{stats:?}"
    );
    let voided = stats
        .iter()
        .find(|s| s.event_type == "invoice.voided")
        .expect("a row per type");
    assert_eq!(
        (
            voided.claimable,
            voided.blocked,
            voided.oldest_claimable_age
        ),
        (0, 1, None),
        "a blocked event is not claimable and not lag: {voided:?}"
    );
    let age = stats
        .iter()
        .find(|s| s.event_type == "invoice.paid")
        .and_then(|s| s.oldest_claimable_age)
        .expect("claimable events have an age");
    assert!(
        age >= Duration::from_secs(5) && age < Duration::from_secs(5) + SLACK,
        "{age:?}"
    );

    let blocked = store.blocked_keys().await.unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(
        (
            blocked[0].partition_key.as_str(),
            blocked[0].blocking_event_id,
            blocked[0].backlog
        ),
        ("blk", b1.event_id, 2)
    );
    let held = store.held_back().await.unwrap();
    let blocked_keys = held.iter().find_map(|h| match h {
        HeldBack::BlockedKeys { keys, waiting } => Some((*keys, *waiting)),
        _ => None,
    });
    assert_eq!(blocked_keys, Some((1, 2)), "{held:?}");
    let backing_off = held.iter().find_map(|h| match h {
        HeldBack::BackingOff {
            keys,
            waiting,
            next_due,
        } => Some((*keys, *waiting, *next_due)),
        _ => None,
    });
    let (keys, waiting, next_due) = backing_off.unwrap_or_else(|| panic!("{held:?}"));
    // retry 1 and 2, delay 1 and 2; the retry comes due first (55 s).
    assert_eq!((keys, waiting), (2, 4), "{held:?}");
    // Store time now, as the store reads it: a heartbeat's.
    store
        .heartbeat(&Heartbeat::alive(RelayId::new("clock")))
        .await
        .unwrap();
    let now = status_of(&*store, "clock").await.last_seen;
    let until = (next_due - now).to_std().expect("due later");
    assert!(
        until > Duration::from_secs(50) && until <= Duration::from_secs(55),
        "{until:?}"
    );
    assert!(
        !held.iter().any(|h| matches!(
            h,
            HeldBack::OpenTransactions { .. }
                | HeldBack::ExpiredLeases { .. }
                | HeldBack::CrashSuspects { .. }
        )),
        "nothing else holds anything: {held:?}"
    );
    // What a claim takes now: the free key only (the others wait on a
    // failed event, a backoff, a delay or the batch in flight).
    assert_eq!(
        claim(&*store, &blocking)
            .await
            .iter()
            .map(|c| c.event.partition_key.as_str())
            .collect::<Vec<_>>(),
        vec!["free"]
    );
}

/// Heartbeats make relays visible with their last-seen time.
pub async fn heartbeats_report_liveness<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    store
        .heartbeat(&Heartbeat::alive(RelayId::new("r1")))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(3));
    store
        .heartbeat(&Heartbeat::alive(RelayId::new("r2")))
        .await
        .unwrap();
    let mut relays = store.relays().await.unwrap();
    relays.sort_by(|a, b| a.relay.cmp(&b.relay));
    assert_eq!(relays.len(), 2);
    let between = (relays[1].last_seen - relays[0].last_seen)
        .to_std()
        .expect("r2 seen after r1");
    assert!(
        between >= Duration::from_secs(3) && between < Duration::from_secs(3) + SLACK,
        "{between:?}"
    );
    assert!(relays.iter().all(|r| r.outage.is_none()), "{relays:?}");
}

/// A relay paused by a publisher outage says so in its heartbeat: the
/// store keeps the destination, the latest reason and when the outage was
/// first recorded, until a beat without one clears it; other relays are
/// untouched.
pub async fn heartbeats_record_publisher_outages<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let relay = RelayId::new("paused");
    let outage = |reason: &str| {
        Heartbeat::in_outage(
            relay.clone(),
            PublisherOutage::new("redis 127.0.0.1:6379 streams outbox:<event type>", reason),
        )
    };
    store
        .heartbeat(&Heartbeat::alive(RelayId::new("fine")))
        .await
        .unwrap();
    store
        .heartbeat(&Heartbeat::alive(relay.clone()))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(10));
    store.heartbeat(&outage("WRONGTYPE")).await.unwrap();
    let began = status_of(&*store, "paused")
        .await
        .outage
        .expect("outage recorded");
    assert_eq!(began.reason, "WRONGTYPE");
    assert_eq!(
        began.destination,
        "redis 127.0.0.1:6379 streams outbox:<event type>"
    );
    clock.advance(Duration::from_secs(30));
    // A quote, a long reason in another script: kept as given, cut where
    // the type says.
    let long = format!("it's down: {}", "é".repeat(3000));
    store.heartbeat(&outage(&long)).await.unwrap();
    let later = status_of(&*store, "paused").await;
    let still = later.outage.clone().expect("still in outage");
    assert_eq!(still.since, began.since, "the outage keeps its start");
    assert_eq!(still.reason, PublisherOutage::new("", long).reason);
    assert!(later.last_seen - still.since >= chrono::Duration::seconds(30));
    assert!(status_of(&*store, "fine").await.outage.is_none());
    store
        .heartbeat(&Heartbeat::alive(relay.clone()))
        .await
        .unwrap();
    assert!(
        status_of(&*store, "paused").await.outage.is_none(),
        "cleared"
    );
    // A new outage starts a new clock.
    clock.advance(Duration::from_secs(5));
    store.heartbeat(&outage("refused")).await.unwrap();
    let again = status_of(&*store, "paused")
        .await
        .outage
        .expect("outage again");
    assert!(again.since > still.since);
}

async fn status_of<S: OutboxAdmin + ?Sized>(store: &S, relay: &str) -> RelayStatus {
    store
        .relays()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.relay == relay)
        .unwrap_or_else(|| panic!("relay {relay} listed"))
}
