//! The store suite, failures: backoff and delays, the poison policies,
//! operator actions, crash loops and releases.

use super::*;

/// A retried event waits for its `available_at`, and holds its key back meanwhile.
pub async fn backoff_honours_available_at<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let (a1, a2, b1) = (event("a", 1), event("a", 2), event("b", 1));
    enqueue_all(&*store, &[a1.clone(), a2.clone()]).await;
    let first = claim(&*store, &request("r1", 1)).await;
    store
        .nack(&[retry(&first[0], Duration::from_secs(30))])
        .await
        .unwrap();
    enqueue_all(&*store, std::slice::from_ref(&b1)).await;
    let during = claim(&*store, &request("r1", 10)).await;
    assert_eq!(
        ids(&during),
        vec![b1.event_id],
        "a2 must wait behind a1's backoff"
    );
    store.ack(&[during[0].lease.clone()]).await.unwrap();
    clock.advance(Duration::from_secs(29));
    assert!(claim(&*store, &request("r1", 10)).await.is_empty());
    clock.advance(Duration::from_secs(2));
    let after = claim(&*store, &request("r1", 10)).await;
    assert_eq!(ids(&after), vec![a1.event_id, a2.event_id]);
    assert_eq!(after[0].event.attempts, 1);
    let history = store.history(a1.event_id).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].kind, AttemptKind::TransientFailure);
    assert_eq!(history[0].error_class, Some(ErrorClass::Transient));
    assert_eq!(history[0].actor, "r1");
}

/// A delayed event is not claimed before its `available_at`.
pub async fn delayed_events_wait<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let mut delayed = event("a", 1);
    delayed.available_at = Some(clock.now_plus(Duration::from_secs(60)));
    enqueue_all(&*store, &[delayed]).await;
    assert!(claim(&*store, &request("r1", 10)).await.is_empty());
    let stats = store.stats().await.unwrap();
    assert_eq!((stats[0].claimable, stats[0].parked), (0, 1));
    clock.advance(Duration::from_secs(61));
    assert_eq!(claim(&*store, &request("r1", 10)).await.len(), 1);
}

/// `Skip`: a failed event does not hold its key back.
pub async fn skip_policy_lets_the_key_continue<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let (a1, a2) = (event("a", 1), event("a", 2));
    enqueue_all(&*store, &[a1.clone(), a2.clone()]).await;
    let first = claim(&*store, &request("r1", 1)).await;
    store.nack(&[fail(&first[0], false)]).await.unwrap();
    assert_eq!(
        ids(&claim(&*store, &request("r1", 10)).await),
        vec![a2.event_id]
    );
    assert!(store.blocked_keys().await.unwrap().is_empty());
    let failed = store.failed_events(10).await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].history[0].kind, AttemptKind::PermanentFailure);
}

/// Failed events page by type and key, oldest first, each page after the
/// sequence of the last one seen: the pages add up to the whole list.
pub async fn failed_events_page_by_type_key_and_sequence<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let typed = |key: &str, n: usize, event_type: &str| {
        let mut e = event(key, n);
        e.event_type = event_type.into();
        e
    };
    let events = [
        typed("a", 1, "t1"),
        typed("a", 2, "t2"),
        typed("b", 1, "t1"),
        typed("b", 2, "t2"),
        typed("c", 1, "t1"),
    ];
    enqueue_all(&*store, &events).await;
    for _ in 0..events.len() {
        let claimed = claim(&*store, &request("r1", 1)).await;
        store.nack(&[fail(&claimed[0], false)]).await.unwrap();
    }
    let all = store.failed_events(10).await.unwrap();
    let listed = |page: &[crate::store::FailedEvent]| {
        page.iter()
            .map(|f| f.event.event.event_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(all.len(), 5);
    let page = |p: crate::store::FailedPage| {
        let store = store.clone();
        async move { store.failed_page(&p).await.unwrap() }
    };
    use crate::store::FailedPage;
    assert_eq!(listed(&page(FailedPage::first(10)).await), listed(&all));
    let of =
        |events: &[&crate::event::NewEvent]| events.iter().map(|e| e.event_id).collect::<Vec<_>>();
    let (a1, a2, b1, b2, c1) = (&events[0], &events[1], &events[2], &events[3], &events[4]);
    let mut t1 = of(&[a1, b1, c1]);
    let order = listed(&all);
    t1.sort_by_key(|id| order.iter().position(|o| o == id));
    assert_eq!(listed(&page(FailedPage::first(10).of_type("t1")).await), t1);
    let key_a = listed(&page(FailedPage::first(10).with_key("a")).await);
    assert_eq!(key_a, of(&[a1, a2]), "a key's failed events in its order");
    assert_eq!(
        listed(&page(FailedPage::first(10).of_type("t2").with_key("b")).await),
        of(&[b2])
    );
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let mut next = FailedPage::first(2);
        if let Some(sequence) = after {
            next = next.after(sequence);
        }
        let got = page(next).await;
        assert!(got.len() <= 2);
        let Some(last) = got.last() else { break };
        after = Some(last.event.sequence);
        paged.extend(listed(&got));
    }
    assert_eq!(paged, order, "pages of two add up to the whole list");
    // Counts agree with the pages, and name the newest sequence matched.
    let sequence_of = |id: EventId| {
        all.iter()
            .find(|f| f.event.event.event_id == id)
            .map(|f| f.event.sequence)
    };
    for (filter, matching) in [
        (FailedPage::first(0), order.clone()),
        (FailedPage::first(0).of_type("t1"), t1.clone()),
        (FailedPage::first(0).with_key("a"), of(&[a1, a2])),
        (FailedPage::first(0).of_type("t2").with_key("b"), of(&[b2])),
        (FailedPage::first(0).with_key("none"), vec![]),
        (
            FailedPage::first(0).after(sequence_of(order[1]).unwrap()),
            order[2..].to_vec(),
        ),
    ] {
        let count = store.count_failed(&filter).await.unwrap();
        assert_eq!(
            (count.count, count.last_sequence),
            (
                matching.len() as u64,
                matching.last().and_then(|id| sequence_of(*id))
            ),
            "{filter:?}"
        );
    }
    let one = store
        .failed_event(b2.event_id)
        .await
        .unwrap()
        .expect("b2 failed");
    assert_eq!(
        one,
        all.iter()
            .find(|f| f.event.event.event_id == b2.event_id)
            .unwrap()
            .clone()
    );
    assert_eq!(store.failed_event(EventId::random()).await.unwrap(), None);
    let newest = all.iter().map(|f| f.event.sequence).max();
    let last = store.last_sequence().await.unwrap();
    assert!(
        last.is_none() || last == newest,
        "{last:?}: none, or the newest's"
    );
    let pending = event("d", 1);
    enqueue_all(&*store, std::slice::from_ref(&pending)).await;
    let after = store.last_sequence().await.unwrap();
    assert!(
        after.is_none() || after > newest,
        "{after:?} after {newest:?}"
    );
    assert_eq!(
        store.failed_event(pending.event_id).await.unwrap(),
        None,
        "not failed: none"
    );
    // A superseded event is no longer one to act on: not counted.
    let fixed = event_with_payload("c", 1, serde_json::json!({ "fixed": true }));
    let op = OperatorAction::new("carol", "corrected");
    store.supersede(c1.event_id, fixed, &op).await.unwrap();
    let t1_now = store
        .count_failed(&FailedPage::first(0).of_type("t1"))
        .await
        .unwrap();
    assert_eq!(t1_now.count, 2, "c1 superseded");
}

/// `Block`: a failed event parks its key and backlog until an operator acts;
/// other keys flow.
pub async fn block_policy_parks_the_key_until_an_operator_acts<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let (a1, a2, a3, b1) = (event("a", 1), event("a", 2), event("a", 3), event("b", 1));
    enqueue_all(&*store, &[a1.clone(), a2.clone(), a3.clone(), b1.clone()]).await;
    let first = claim(&*store, &request("r1", 1)).await;
    assert_eq!(ids(&first), vec![a1.event_id]);
    store.nack(&[fail(&first[0], true)]).await.unwrap();
    assert_eq!(
        ids(&claim(&*store, &request("r1", 10)).await),
        vec![b1.event_id]
    );
    let blocked = store.blocked_keys().await.unwrap();
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].partition_key, "a");
    assert_eq!(blocked[0].blocking_event_id, a1.event_id);
    assert_eq!(blocked[0].backlog, 2);

    let op = OperatorAction::new("alice", "payload fixed downstream");
    store.skip(a1.event_id, &op).await.unwrap();
    assert!(store.blocked_keys().await.unwrap().is_empty());
    assert_eq!(
        ids(&claim(&*store, &request("r1", 10)).await),
        vec![a2.event_id, a3.event_id]
    );
    let history = store.history(a1.event_id).await.unwrap();
    assert_eq!(history.last().unwrap().kind, AttemptKind::Skipped);
    assert_eq!(history.last().unwrap().actor, "alice");
    assert!(matches!(
        state(&*store, a1.event_id).await,
        EventState::Failed {
            blocks_key: false,
            ..
        }
    ));
}

/// The events parked behind a blocking failure, those enqueued before it
/// and after it (a store may set them aside when a claim meets them), wait
/// through many claims, count as blocked, read as pending, and come back in
/// order with whichever action lifts the block: requeue, skip, or the
/// publication of a replacement.
pub async fn parked_events_come_back_with_every_operator_action<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let keys = ["requeued", "skipped", "superseded"];
    let before: Vec<[NewEvent; 2]> = keys.iter().map(|k| [event(k, 1), event(k, 2)]).collect();
    let (firsts, seconds): (Vec<_>, Vec<_>) = before.iter().cloned().map(|[a, b]| (a, b)).unzip();
    enqueue_all(&*store, &[firsts, seconds].concat()).await;
    let heads = claim(&*store, &request("r1", 3)).await;
    assert_eq!(heads.len(), 3, "each key's head");
    let nacks: Vec<Nack> = heads.iter().map(|h| fail(h, true)).collect();
    store.nack(&nacks).await.unwrap();
    // Claims meet the parked events (and may set them aside) while other
    // keys flow; more events arrive behind the blocks meanwhile.
    let mut after = Vec::new();
    for round in 0..3 {
        let other = event("other", round);
        let late: Vec<NewEvent> = keys.iter().map(|k| event(k, 3 + round)).collect();
        enqueue_all(&*store, &[late.clone(), vec![other.clone()]].concat()).await;
        after.push(late);
        let claimed = claim(&*store, &request("r1", 100)).await;
        assert_eq!(ids(&claimed), vec![other.event_id], "round {round}");
        ack_all(&*store, &claimed).await;
    }
    let waiting: u64 = store.stats().await.unwrap().iter().map(|s| s.blocked).sum();
    assert_eq!(waiting, 12, "four parked events on each of three keys");
    let blocked = store.blocked_keys().await.unwrap();
    assert_eq!(
        blocked.iter().map(|b| b.backlog).collect::<Vec<_>>(),
        vec![4; 3]
    );
    assert!(matches!(
        state(&*store, before[0][1].event_id).await,
        EventState::Pending { .. }
    ));
    let backlog = |k: usize| -> Vec<EventId> {
        let late = after.iter().map(|l| l[k].event_id);
        std::iter::once(before[k][1].event_id).chain(late).collect()
    };

    let op = OperatorAction::new("dana", "fixed");
    store.requeue(heads[0].event.event_id, &op).await.unwrap();
    let head = vec![heads[0].event.event_id];
    assert_eq!(drain(&*store).await, [head, backlog(0)].concat());
    store.skip(heads[1].event.event_id, &op).await.unwrap();
    assert_eq!(drain(&*store).await, backlog(1));
    let fixed = event_with_payload("superseded", 1, serde_json::json!({ "fixed": true }));
    store
        .supersede(heads[2].event.event_id, fixed.clone(), &op)
        .await
        .unwrap();
    assert_eq!(
        drain(&*store).await,
        [vec![fixed.event_id], backlog(2)].concat()
    );
    assert!(store.blocked_keys().await.unwrap().is_empty());
}

/// Requeue moves a failed event back with a fresh budget; history is only
/// appended to.
pub async fn requeue_appends_history<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let c = claim(&*store, &request("r1", 1)).await;
    store.nack(&[retry(&c[0], Duration::ZERO)]).await.unwrap();
    let c = claim(&*store, &request("r1", 1)).await;
    store.nack(&[fail(&c[0], true)]).await.unwrap();
    let before = store.history(e.event_id).await.unwrap();
    assert_eq!(before.len(), 2);

    let op = OperatorAction::new("bob", "topic created");
    store.requeue(e.event_id, &op).await.unwrap();
    let after = store.history(e.event_id).await.unwrap();
    assert_eq!(after.len(), 3);
    assert_eq!(
        &after[..2],
        &before[..],
        "earlier entries are never rewritten"
    );
    assert_eq!(after[2].kind, AttemptKind::Requeued);
    assert_eq!(
        (after[2].actor.as_str(), after[2].detail.as_str()),
        ("bob", "topic created")
    );
    let again = claim(&*store, &request("r1", 1)).await;
    assert_eq!(ids(&again), vec![e.event_id]);
    assert_eq!(
        again[0].event.attempts, 0,
        "requeue restores the attempt budget"
    );

    let err = store.requeue(e.event_id, &op).await.unwrap_err();
    assert!(
        matches!(err, StoreError::WrongState { .. }),
        "only failed events can be requeued: {err:?}"
    );
    let err = store.requeue(EventId::random(), &op).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)));
}

/// A replacement takes the failed event's place in its key's order; the old
/// event stays, linked, for audit.
pub async fn supersede_takes_the_place_of_the_failed_event<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let (a1, a2) = (event("a", 1), event("a", 2));
    enqueue_all(&*store, &[a1.clone(), a2.clone()]).await;
    let c = claim(&*store, &request("r1", 1)).await;
    store.nack(&[fail(&c[0], true)]).await.unwrap();
    let fixed = event_with_payload("a", 1, serde_json::json!({ "fixed": true }));
    let op = OperatorAction::new("carol", "corrected amount");
    let outcome = store
        .supersede(a1.event_id, fixed.clone(), &op)
        .await
        .unwrap();
    assert!(matches!(outcome, EnqueueOutcome::Inserted { .. }));
    // Drain the key, acknowledging as we go: a store may lease the
    // replacement alone and release the backlog only once it is published.
    let order = drain(&*store).await;
    assert_eq!(
        order,
        vec![fixed.event_id, a2.event_id],
        "replacement before the backlog"
    );
    assert!(matches!(
        state(&*store, a1.event_id).await,
        EventState::Failed { superseded_by: Some(id), .. } if id == fixed.event_id
    ));
    assert_eq!(
        store
            .history(a1.event_id)
            .await
            .unwrap()
            .last()
            .unwrap()
            .kind,
        AttemptKind::Superseded
    );
}

/// Requeue and skip on many events at once (`requeue_each`, `skip_each`):
/// each failed one is acted on and recorded with the operator, the others
/// are passed over, and a key a requeued event blocked flows again.
pub async fn operators_act_on_many_failed_events_at_once<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let (a1, a2, b1, c1) = (event("a", 1), event("a", 2), event("b", 1), event("c", 1));
    enqueue_all(&*store, &[a1.clone(), a2.clone(), b1.clone(), c1.clone()]).await;
    // a1 fails blocking its key (a2 parked behind it); b1 and c1 fail alone.
    for blocks in [true, false, false] {
        let claimed = claim(&*store, &request("r1", 1)).await;
        store.nack(&[fail(&claimed[0], blocks)]).await.unwrap();
    }
    let pending = event("d", 1);
    enqueue_all(&*store, std::slice::from_ref(&pending)).await;
    let sorted = |mut v: Vec<EventId>| {
        v.sort_by_key(|id| id.to_string());
        v
    };
    let op = OperatorAction::new("erin", "consumer fixed");
    let requeued = store
        .requeue_each(
            &[
                a1.event_id,
                b1.event_id,
                pending.event_id,
                EventId::random(),
            ],
            &op,
        )
        .await
        .unwrap();
    assert_eq!(
        sorted(requeued),
        sorted(vec![a1.event_id, b1.event_id]),
        "the failed ones; the pending and the unknown passed over"
    );
    for id in [a1.event_id, b1.event_id] {
        let last = store.history(id).await.unwrap().pop().unwrap();
        assert_eq!(
            (last.kind, last.actor.as_str(), last.detail.as_str()),
            (AttemptKind::Requeued, "erin", "consumer fixed")
        );
    }
    let published = drain(&*store).await;
    assert_eq!(
        sorted(published.clone()),
        sorted(vec![
            a1.event_id,
            a2.event_id,
            b1.event_id,
            pending.event_id
        ]),
        "the requeued, the key they unblocked, the pending one"
    );
    let position = |id: EventId| published.iter().position(|p| *p == id);
    assert!(
        position(a1.event_id) < position(a2.event_id),
        "a's order kept"
    );
    let skipped = store
        .skip_each(&[c1.event_id, a1.event_id], &op)
        .await
        .unwrap();
    assert_eq!(skipped, vec![c1.event_id], "a1 was published, not failed");
    assert!(matches!(
        state(&*store, c1.event_id).await,
        EventState::Failed { .. }
    ));
    let last = store.history(c1.event_id).await.unwrap().pop().unwrap();
    assert_eq!(
        (last.kind, last.actor.as_str()),
        (AttemptKind::Skipped, "erin")
    );
    assert!(store.requeue_each(&[], &op).await.unwrap().is_empty());
}

/// Claims that never reach an outcome end in `failed` after the bound.
pub async fn crash_loops_end_in_failed<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let (a1, a2) = (event("a", 1), event("a", 2));
    enqueue_all(&*store, &[a1.clone(), a2.clone()]).await;
    let req = request("r1", 1);
    for _ in 0..req.crash_loop_limit {
        let c = store.claim_batch(&req).await.unwrap();
        assert_eq!(ids(&c.events), vec![a1.event_id]);
        assert!(c.crash_looped.is_empty());
        clock.advance(LEASE + Duration::from_secs(1)); // the relay died mid-publish
    }
    let c = store.claim_batch(&req).await.unwrap();
    assert_eq!(
        c.crash_looped
            .iter()
            .map(|e| e.event_id)
            .collect::<Vec<_>>(),
        vec![a1.event_id]
    );
    assert_eq!(
        ids(&c.events),
        vec![a2.event_id],
        "under Skip the key continues"
    );
    assert!(matches!(
        state(&*store, a1.event_id).await,
        EventState::Failed { .. }
    ));
    let history = store.history(a1.event_id).await.unwrap();
    assert_eq!(history.last().unwrap().kind, AttemptKind::CrashLoop);
}

/// Releasing burns no attempt and does not count towards crash loops.
pub async fn release_burns_no_attempt<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let req = request("r1", 1);
    for _ in 0..(req.crash_loop_limit * 3) {
        let c = store.claim_batch(&req).await.unwrap();
        assert_eq!(ids(&c.events), vec![e.event_id]);
        let released = store
            .release(&[Release {
                lease: c.events[0].lease.clone(),
                attempt_started: false,
            }])
            .await
            .unwrap();
        assert_eq!(released.applied, 1);
    }
    let c = claim(&*store, &req).await;
    assert_eq!(c[0].event.attempts, 0);
    assert!(store.history(e.event_id).await.unwrap().is_empty());
}
