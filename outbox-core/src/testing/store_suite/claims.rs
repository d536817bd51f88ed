//! The store suite, claims: enqueue, exclusive and ordered claims, leases
//! and their expiry, fencing.

use super::*;

/// Enqueueing an existing `event_id` writes nothing and says so.
pub async fn duplicate_enqueue_is_reported_noop<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let e = event("a", 1);
    let first = store.enqueue(std::slice::from_ref(&e)).await.unwrap();
    assert!(matches!(first[0], EnqueueOutcome::Inserted { .. }));
    let mut replay = event("a", 99);
    replay.event_id = e.event_id;
    let second = store.enqueue(&[replay, event("a", 2)]).await.unwrap();
    assert_eq!(second[0], EnqueueOutcome::AlreadyExists);
    assert!(matches!(second[1], EnqueueOutcome::Inserted { .. }));
    let claimed = claim(&*store, &request("r1", 10)).await;
    assert_eq!(claimed.len(), 2, "the duplicate must not add a row");
    // Compared as JSON values: a store may normalise the text (jsonb does).
    let stored: serde_json::Value = claimed[0].event.payload.deserialize().unwrap();
    let original: serde_json::Value = e.payload.deserialize().unwrap();
    assert_eq!(stored, original, "the original row is untouched");
}

/// Every field of an event comes back from a claim as it was enqueued,
/// whether the event was enqueued alone or in a batch (a store may write
/// the two with different statements), its delay counted from store time
/// either way.
pub async fn every_field_comes_back_enqueued_alone_or_in_a_batch<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let shaped = |n: u32, delayed: bool| {
        let mut builder = NewEvent::builder(
            format!("invoice.paid.v{n}"),
            format!("invoice-{n}"),
            format!("inv-{n}"),
        )
        .event_id(EventId::random())
        .partition_key(format!("customer-{n}"))
        .payload(&serde_json::json!({ "n": n, "currency": "EUR", "lines": [n, n + 1] }))
        .payload_version(n + 1)
        .correlation_id(format!("corr-{n}"))
        .causation_id(format!("cause-{n}"))
        .header("tenant", format!("t-{n}"));
        if delayed {
            builder = builder.available_at(clock.now_plus(Duration::from_secs(30)));
        }
        builder.build().unwrap()
    };
    let alone = shaped(1, false);
    let alone_delayed = shaped(2, true);
    let batch = [shaped(3, false), shaped(4, true), shaped(5, false)];
    for e in [&alone, &alone_delayed] {
        let outcome = store.enqueue(std::slice::from_ref(e)).await.unwrap();
        assert!(matches!(outcome[..], [EnqueueOutcome::Inserted { .. }]));
    }
    let outcomes = store.enqueue(&batch).await.unwrap();
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, EnqueueOutcome::Inserted { .. }))
    );
    let check = |claimed: &ClaimedEvent, original: &NewEvent| {
        let got = &claimed.event;
        assert_eq!(
            (
                &got.aggregate_type,
                &got.aggregate_id,
                &got.event_type,
                &got.partition_key
            ),
            (
                &original.aggregate_type,
                &original.aggregate_id,
                &original.event_type,
                &original.partition_key
            ),
            "{}",
            original.event_id
        );
        assert_eq!(got.payload_version, original.payload_version);
        assert_eq!(got.headers, original.headers, "{}", original.event_id);
        // As JSON values: a store may normalise the text (jsonb does).
        let stored: serde_json::Value = got.payload.deserialize().unwrap();
        let sent: serde_json::Value = original.payload.deserialize().unwrap();
        assert_eq!(stored, sent);
        assert_eq!(got.attempts, 0);
    };
    let now = claim(&*store, &request("r1", 10)).await;
    assert_eq!(
        ids(&now),
        [alone.event_id, batch[0].event_id, batch[2].event_id]
    );
    for (claimed, original) in now.iter().zip([&alone, &batch[0], &batch[2]]) {
        check(claimed, original);
        assert!(
            claimed.event.available_at <= claimed.event.created_at + chrono::Duration::seconds(1)
        );
    }
    ack_all(&*store, &now).await;
    clock.advance(Duration::from_secs(31));
    let later = claim(&*store, &request("r1", 10)).await;
    let mut later_ids = ids(&later);
    later_ids.sort();
    let mut delayed_ids = vec![alone_delayed.event_id, batch[1].event_id];
    delayed_ids.sort();
    assert_eq!(later_ids, delayed_ids, "the delayed events, once due");
    for claimed in &later {
        let original = [&alone_delayed, &batch[1]]
            .into_iter()
            .find(|e| e.event_id == claimed.event.event_id)
            .unwrap();
        check(claimed, original);
        let delay = claimed.event.available_at - claimed.event.created_at;
        assert!(
            (29..=31).contains(&delay.num_seconds()),
            "a 30 s delay counted from store time, got {delay}"
        );
    }
}

/// Bad input is refused with a typed error and nothing of the batch is written.
pub async fn invalid_events_are_refused_atomically<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let huge = "x".repeat(2 * 1024 * 1024);
    let oversized = event_with_payload("a", 1, serde_json::json!({ "blob": huge }));
    let err = store
        .enqueue(&[event("a", 0), oversized])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidEvent(InvalidEvent::PayloadTooLarge { .. })
        ),
        "got {err:?}"
    );
    assert!(!err.is_retryable());
    let mut empty_type = event("a", 2);
    empty_type.event_type = String::new();
    let err = store.enqueue(&[empty_type]).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidEvent(InvalidEvent::EmptyField("event_type"))
        ),
        "got {err:?}"
    );
    let mut long_key = event("a", 3);
    long_key.partition_key = "k".repeat(10_000);
    let err = store.enqueue(&[long_key]).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InvalidEvent(InvalidEvent::FieldTooLong { .. })
        ),
        "got {err:?}"
    );
    assert!(
        claim(&*store, &request("r1", 10)).await.is_empty(),
        "nothing of a refused batch is written"
    );
}

/// Concurrent claimers never receive the same event.
pub async fn claims_are_exclusive_under_concurrency<F: StoreFactory>(factory: &F) {
    for ordering in [Ordering::Unordered, Ordering::PerKey] {
        let store = factory.create(ManualClock::at_epoch()).await;
        let events = events_over_keys(300, 300);
        enqueue_all(&*store, &events).await;
        let mut tasks = Vec::new();
        for r in 0..8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut request = request(&format!("r{r}"), 7);
                request.ordering = ordering;
                let mut mine = Vec::new();
                loop {
                    let batch = claim(&*store, &request).await;
                    if batch.is_empty() {
                        return mine;
                    }
                    mine.extend(ids(&batch));
                    tokio::task::yield_now().await;
                }
            }));
        }
        let mut seen = HashSet::new();
        for task in tasks {
            for id in task.await.unwrap() {
                assert!(seen.insert(id), "{id} claimed twice ({ordering:?})");
            }
        }
        assert_eq!(
            seen.len(),
            events.len(),
            "every event claimed once ({ordering:?})"
        );
    }
}

/// A batch holds a prefix of each key in order; nothing of a key whose head
/// is leased is handed to another claimer.
pub async fn per_key_claims_are_ordered_prefixes<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let (a1, a2, a3, b1) = (event("a", 1), event("a", 2), event("a", 3), event("b", 1));
    enqueue_all(&*store, &[a1.clone(), a2.clone(), a3.clone(), b1.clone()]).await;
    let first = claim(&*store, &request("r1", 1)).await;
    assert_eq!(ids(&first), vec![a1.event_id], "the oldest head first");
    let second = claim(&*store, &request("r2", 10)).await;
    assert_eq!(ids(&second), vec![b1.event_id], "key a is held by r1");
    store.ack(&[first[0].lease.clone()]).await.unwrap();
    let third = claim(&*store, &request("r2", 10)).await;
    assert_eq!(
        ids(&third),
        vec![a2.event_id, a3.event_id],
        "the rest of key a, in order"
    );
    assert!(third[0].lease.sequence < third[1].lease.sequence);
}

/// An expired lease makes its event claimable again, under a new token.
pub async fn lease_expiry_makes_events_claimable_again<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let first = claim(&*store, &request("r1", 10)).await;
    assert_eq!(first.len(), 1);
    assert!(claim(&*store, &request("r2", 10)).await.is_empty());
    clock.advance(LEASE - Duration::from_secs(1));
    assert!(
        claim(&*store, &request("r2", 10)).await.is_empty(),
        "lease still valid"
    );
    clock.advance(Duration::from_secs(2));
    let second = claim(&*store, &request("r2", 10)).await;
    assert_eq!(ids(&second), vec![e.event_id]);
    assert!(second[0].lease.fencing_token > first[0].lease.fencing_token);
    assert!(
        matches!(state(&*store, e.event_id).await, EventState::InFlight { owner, .. } if owner == "r2")
    );
}

/// A relay that dies (or pauses past its lease) holding a batch over many
/// keys: once the lease has expired, the next claim takes the whole batch
/// back, so its keys resume after one lease, not one per claim. If that
/// lease dies too, the rows go back in halves (a poison event among them is
/// being looked for); nobody is blamed and nothing fails.
pub async fn a_dead_relays_keys_come_back_in_one_claim<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let events = events_over_keys(40, 40);
    enqueue_all(&*store, &events).await;
    let expected: HashSet<EventId> = events.iter().map(|e| e.event_id).collect();
    let dead = claim(&*store, &request("r-dead", 40)).await;
    assert_eq!(dead.len(), 40);
    clock.advance(LEASE + Duration::from_secs(1));
    let back = claim(&*store, &request("r-next", 100)).await;
    assert_eq!(
        ids(&back).into_iter().collect::<HashSet<_>>(),
        expected,
        "the dead relay's 40 keys come back in one claim, not one per claim"
    );
    // That relay dies as well: the 40 crashed twice together, and go back
    // 20 at a time.
    clock.advance(LEASE + Duration::from_secs(1));
    let first_half = claim(&*store, &request("r-third", 100)).await;
    assert_eq!(first_half.len(), 20, "{:?}", ids(&first_half));
    let second_half = claim(&*store, &request("r-fourth", 100)).await;
    assert_eq!(second_half.len(), 20, "{:?}", ids(&second_half));
    let leases: Vec<_> = first_half
        .iter()
        .chain(&second_half)
        .map(|c| c.lease.clone())
        .collect();
    assert_eq!(store.ack(&leases).await.unwrap().applied, 40);
    assert!(store.failed_events(10).await.unwrap().is_empty());
    assert_published(&*store, &events).await;
}

/// A hot key's backlog costs only that key: while one relay holds the head
/// of a key with 1,000 events waiting behind it, another relay's claims
/// reach the events other keys committed after the burst within a few
/// claims (never waiting for the burst to drain), and the hot key goes on
/// in order afterwards.
pub async fn a_hot_keys_backlog_holds_no_other_key<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let hot: Vec<_> = (0..1000).map(|n| event("hot", n)).collect();
    for burst in hot.chunks(250) {
        enqueue_all(&*store, burst).await;
    }
    let head = claim(&*store, &request("r-hot", 100)).await;
    assert_eq!(
        ids(&head),
        ids_of(&hot[..100]),
        "the hot key's head, in order"
    );
    // Other keys commit after the burst: behind it in commit order.
    let cold: Vec<_> = (0..5).map(|k| event(&format!("cold-{k}"), 0)).collect();
    enqueue_all(&*store, &cold).await;

    let mut reached = HashSet::new();
    for _ in 0..4 {
        let batch = claim(&*store, &request("r-other", 100)).await;
        assert!(
            batch.iter().all(|c| c.event.partition_key != "hot"),
            "the hot key is in flight"
        );
        reached.extend(ids(&batch));
        if reached.len() == cold.len() {
            break;
        }
    }
    assert_eq!(
        reached,
        cold.iter().map(|e| e.event_id).collect::<HashSet<_>>(),
        "the other keys' events within four claims, behind a 900-event backlog of one key"
    );

    store
        .ack(&head.iter().map(|c| c.lease.clone()).collect::<Vec<_>>())
        .await
        .unwrap();
    let next = claim(&*store, &request("r-hot", 100)).await;
    assert_eq!(
        ids(&next),
        ids_of(&hot[100..200]),
        "the hot key goes on in order"
    );
}

fn ids_of(events: &[crate::event::NewEvent]) -> Vec<EventId> {
    events.iter().map(|e| e.event_id).collect()
}

/// A relay that lost its lease cannot settle over the newer claim.
pub async fn stale_settlements_are_fenced<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let stale = claim(&*store, &request("r1", 10)).await;
    clock.advance(LEASE + Duration::from_secs(1));
    let fresh = claim(&*store, &request("r2", 10)).await;
    assert_eq!(fresh.len(), 1);

    let report = store.ack(&[stale[0].lease.clone()]).await.unwrap();
    assert_eq!(
        (report.applied, report.fenced.clone()),
        (0, vec![e.event_id])
    );
    let report = store.nack(&[fail(&stale[0], true)]).await.unwrap();
    assert_eq!(report.fenced, vec![e.event_id]);
    let report = store
        .release(&[Release {
            lease: stale[0].lease.clone(),
            attempt_started: false,
        }])
        .await
        .unwrap();
    assert_eq!(report.fenced, vec![e.event_id]);
    assert!(
        matches!(state(&*store, e.event_id).await, EventState::InFlight { owner, .. } if owner == "r2")
    );

    let report = store.ack(&[fresh[0].lease.clone()]).await.unwrap();
    assert_eq!(report.applied, 1);
    assert!(report.fenced.is_empty());
    assert!(matches!(
        state(&*store, e.event_id).await,
        EventState::Published { .. }
    ));
    let again = store.ack(&[fresh[0].lease.clone()]).await.unwrap();
    assert_eq!(
        again.fenced,
        vec![e.event_id],
        "a settled lease cannot settle twice"
    );
}
