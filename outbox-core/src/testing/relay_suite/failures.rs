//! The relay suite, failures: attempt caps, poison policies, crash loops,
//! timeouts, backoff and shutdown.

use super::*;

/// Transient failures up to the cap end in `failed`, with history and one alert.
pub async fn attempts_cap_moves_to_failed<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let (a1, a2) = (event("a", 1), event("a", 2));
    enqueue_all(&*store, &[a1.clone(), a2.clone()]).await;
    let publisher = Arc::new(RecordingPublisher::new());
    publisher.inject(a1.event_id, Fault::FailAlways(ErrorClass::Transient));
    let alerts = Alerts::default();
    let mut cfg = config("relay-cap");
    cfg.retry = RetryPolicy::immediate(3);
    let relay = start(store.clone(), publisher.clone(), cfg, Some(&alerts));
    within(
        "the key to continue past the failed event",
        publisher.wait_for_deliveries(1),
    )
    .await;
    within("the alert", alerts.wait_for(1)).await;
    let report = relay.stop().await;
    assert_eq!((report.retried, report.failed, report.published), (2, 1, 1));
    assert_eq!(publisher.delivered_ids(), vec![a2.event_id]);
    let kinds: Vec<_> = store
        .history(a1.event_id)
        .await
        .unwrap()
        .iter()
        .map(|h| h.kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            AttemptKind::TransientFailure,
            AttemptKind::TransientFailure,
            AttemptKind::AttemptsExhausted
        ]
    );
    let alerts = alerts.taken();
    assert_eq!(alerts.len(), 1);
    assert_eq!(
        (alerts[0].event.event_id, alerts[0].cause),
        (a1.event_id, FailureCause::AttemptsExhausted)
    );
}

/// Poison under `Skip` fails and the key goes on; under `Block` the key
/// waits, in order, until an operator skips the poison; other keys flow.
pub async fn poison_skip_and_block<F: StoreFactory>(factory: &F) {
    for policy in [PoisonPolicy::Skip, PoisonPolicy::Block] {
        let store = factory.create(ManualClock::at_epoch()).await;
        let (a1, a2, a3, b1) = (event("a", 1), event("a", 2), event("a", 3), event("b", 1));
        enqueue_all(&*store, &[a1.clone(), a2.clone(), a3.clone(), b1.clone()]).await;
        let publisher = Arc::new(RecordingPublisher::new());
        publisher.inject(a1.event_id, Fault::FailAlways(ErrorClass::Permanent));
        let alerts = Alerts::default();
        let mut cfg = config("relay-poison");
        cfg.poison = policy;
        let relay = start(store.clone(), publisher.clone(), cfg.clone(), Some(&alerts));
        within("the poison alert", alerts.wait_for(1)).await;
        let want_now = if policy == PoisonPolicy::Skip { 3 } else { 1 };
        within("deliveries", publisher.wait_for_deliveries(want_now)).await;
        relay.stop().await;
        assert_eq!(alerts.taken()[0].cause, FailureCause::Permanent);
        assert_eq!(alerts.taken()[0].key_blocked, policy == PoisonPolicy::Block);
        let delivered = by_key(&publisher.delivered());
        assert_eq!(
            delivered["b"],
            vec![b1.event_id],
            "other keys are never blocked"
        );
        if policy == PoisonPolicy::Skip {
            assert_eq!(delivered["a"], vec![a2.event_id, a3.event_id]);
            continue;
        }
        assert!(
            !delivered.contains_key("a"),
            "a blocked key publishes nothing"
        );
        let blocked = store.blocked_keys().await.unwrap();
        assert_eq!((blocked.len(), blocked[0].backlog), (1, 2));
        store
            .skip(
                a1.event_id,
                &crate::store::OperatorAction::new("ops", "dropped bad event"),
            )
            .await
            .unwrap();
        let relay = start(store.clone(), publisher.clone(), cfg, None);
        within("the backlog after skip", publisher.wait_for_deliveries(3)).await;
        relay.stop().await;
        assert_eq!(
            by_key(&publisher.delivered())["a"],
            vec![a2.event_id, a3.event_id]
        );
    }
}

/// A relay that keeps dying while publishing one event: after the bound the
/// event is failed (alert fired) and its key continues.
pub async fn crash_loop_ends_in_failed<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let (a1, a2) = (event("a", 1), event("a", 2));
    enqueue_all(&*store, &[a1.clone(), a2.clone()]).await;
    let publisher = Arc::new(RecordingPublisher::new());
    publisher.inject(a1.event_id, Fault::Hang);
    let mut cfg = config("relay-crashy");
    cfg.batch_size = 1;
    for crash in 1..=cfg.crash_loop_limit as usize {
        let relay = start(store.clone(), publisher.clone(), cfg.clone(), None);
        within("the hanging publish", publisher.wait_for_calls(crash)).await;
        relay.crash().await;
        clock.advance(LEASE + Duration::from_secs(1));
    }
    let alerts = Alerts::default();
    let relay = start(store.clone(), publisher.clone(), cfg, Some(&alerts));
    within("the key to continue", publisher.wait_for_deliveries(1)).await;
    let report = relay.stop().await;
    assert_eq!(report.failed, 1);
    assert_eq!(publisher.delivered_ids(), vec![a2.event_id]);
    let alerts = alerts.taken();
    assert_eq!(
        (alerts[0].event.event_id, alerts[0].cause),
        (a1.event_id, FailureCause::CrashLoop)
    );
    let history = store.history(a1.event_id).await.unwrap();
    assert_eq!(history.last().unwrap().kind, AttemptKind::CrashLoop);
}

/// A publish that outlives the publish timeout counts as a transient failure.
pub async fn publish_timeout_is_a_transient_failure<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let (mock, handle) = MockPublisher::pair();
    let mut cfg = config("relay-timeout");
    cfg.publish_timeout = Duration::from_millis(100);
    let relay = start(store.clone(), Arc::new(mock), cfg, None);
    within("first call", handle.next_call()).await.hang();
    let retry = within("the retry", handle.next_call()).await;
    assert_eq!(retry.events[0].attempts, 1);
    retry.succeed_all();
    let report = relay.stop().await;
    assert_eq!((report.retried, report.published), (1, 1));
    let history = store.history(e.event_id).await.unwrap();
    assert!(history[0].detail.contains("timed out"), "{history:?}");
}

/// A retry's backoff holds its key back inside the relay, other keys flow,
/// and the key resumes in order once the backoff has passed.
pub async fn backoff_holds_the_key_back<F: StoreFactory>(factory: &F) {
    let clock = ManualClock::at_epoch();
    let store = factory.create(clock.clone()).await;
    let (a1, a2, b1) = (event("a", 1), event("a", 2), event("b", 1));
    enqueue_all(&*store, &[a1.clone(), a2.clone(), b1.clone()]).await;
    let publisher = Arc::new(RecordingPublisher::new());
    publisher.inject(a1.event_id, Fault::FailTimes(ErrorClass::Transient, 1));
    let mut cfg = config("relay-backoff");
    cfg.retry = RetryPolicy {
        max_attempts: 5,
        initial_interval: Duration::from_secs(60),
        max_interval: Duration::from_secs(60),
        multiplier: 2.0,
        jitter: 0.0,
    };
    let relay = start(store.clone(), publisher.clone(), cfg.clone(), None);
    within("key b", publisher.wait_for_deliveries(1)).await;
    let report = relay.stop().await;
    assert_eq!(report.retried, 1, "{report:?}");
    assert_eq!(publisher.delivered_ids(), vec![b1.event_id]);
    assert!(matches!(
        state(&*store, a1.event_id).await,
        EventState::Pending { attempts: 1, .. }
    ));
    assert!(matches!(
        state(&*store, a2.event_id).await,
        EventState::Pending { attempts: 0, .. }
    ));

    clock.advance(Duration::from_secs(61));
    let relay = start(store.clone(), publisher.clone(), cfg, None);
    within("key a after backoff", publisher.wait_for_deliveries(3)).await;
    relay.stop().await;
    assert_eq!(
        by_key(&publisher.delivered())["a"],
        vec![a1.event_id, a2.event_id]
    );
}

/// Shutdown lets the batch in flight finish and acknowledges it.
pub async fn shutdown_drains_the_batch_in_flight<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let (mock, handle) = MockPublisher::pair();
    let relay = start(store.clone(), Arc::new(mock), config("relay-drain"), None);
    let call = within("the publish", handle.next_call()).await;
    relay.shutdown.cancel();
    call.succeed_all();
    let report = within("drain", relay.handle).await.unwrap().unwrap();
    assert!(report.drained);
    assert_eq!(report.published, 1);
    assert!(matches!(
        state(&*store, e.event_id).await,
        EventState::Published { .. }
    ));
}

/// A batch that overruns the drain timeout has its leases released at
/// once, so another relay need not wait for them to expire.
pub async fn shutdown_drain_timeout_releases_leases<F: StoreFactory>(factory: &F) {
    let store = factory.create(ManualClock::at_epoch()).await;
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let (mock, handle) = MockPublisher::pair();
    let mut cfg = config("relay-stuck");
    cfg.drain_timeout = Duration::from_millis(50);
    let relay = start(store.clone(), Arc::new(mock), cfg, None);
    let _stuck = within("the publish", handle.next_call()).await;
    let report = relay.stop().await;
    assert!(!report.drained);
    assert_eq!(report.released, 1);
    assert!(matches!(
        state(&*store, e.event_id).await,
        EventState::Pending { attempts: 0, .. }
    ));

    let publisher = Arc::new(RecordingPublisher::new());
    let next = start(store.clone(), publisher.clone(), config("relay-next"), None);
    within(
        "delivery by the next relay (no lease wait)",
        publisher.wait_for_deliveries(1),
    )
    .await;
    next.stop().await;
    let ids: HashSet<_> = publisher.delivered_ids().into_iter().collect();
    assert!(ids.contains(&e.event_id));
}

/// A relay over a store that cannot work (tables never migrated, the wrong
/// database, a role without rights) stops by itself with the store's error,
/// non-retryable and mentioning `expect`, instead of logging a warning
/// forever. Not a factory test: the caller builds the broken store.
pub async fn stops_on_a_store_that_cannot_work<S>(store: Arc<S>, expect: &str)
where
    S: OutboxStore + 'static,
{
    let publisher = Arc::new(RecordingPublisher::new());
    let relay = Relay::new(store, publisher.clone(), config("cannot-work")).expect("valid config");
    // Never cancelled: only the relay itself can end this.
    let outcome = within(
        "the relay to stop by itself",
        relay.run(CancellationToken::new()),
    )
    .await;
    let stopped = outcome.expect_err("a relay that cannot work must not look alive");
    assert!(!stopped.error.is_retryable(), "{stopped}");
    assert!(
        stopped.to_string().contains(expect),
        "the error says why: {stopped} (expected it to mention {expect:?})"
    );
    assert_eq!(
        stopped.report.store_errors, 1,
        "stopped at the first such error"
    );
    assert!(publisher.delivered().is_empty());
}
