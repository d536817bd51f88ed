//! The store suite, commit order: late committers, commit order and
//! other applications' transactions.

use super::*;

/// A transaction that commits late is never skipped: its event is
/// published once it commits, whatever was published meanwhile (the
/// visibility race that makes naive relays lose events).
pub async fn late_committers_are_never_skipped<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: BeginWrite,
{
    let store = factory.create(ManualClock::at_epoch()).await;
    // Two keys: stores that make writers of one key take turns (MySQL)
    // would otherwise wait here for the first commit.
    let (first, second) = (event("a", 1), event("b", 2));
    let mut early = store.begin_write().await.unwrap();
    early.enqueue(first.clone()).await.unwrap();
    let mut late = store.begin_write().await.unwrap();
    late.enqueue(second.clone()).await.unwrap();
    late.commit().await.unwrap();
    // The two transactions overlap, so either order is fine; the store may
    // also wait for the open one.
    let mut published = Vec::new();
    let claimed = claim(&*store, &request("r1", 10)).await;
    assert!(
        !ids(&claimed).contains(&first.event_id),
        "an uncommitted event was claimed"
    );
    published.extend(ids(&claimed));
    ack_all(&*store, &claimed).await;
    early.commit().await.unwrap();
    published.extend(drain(&*store).await);
    published.sort();
    let mut expected = vec![first.event_id, second.event_id];
    expected.sort();
    assert_eq!(published, expected, "both published, once each");
}

/// Order means commit order: a transaction that did its
/// business write first but enqueued after another transaction committed
/// publishes after that one, whatever the store numbers transactions by.
pub async fn order_is_commit_order<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: BeginWrite,
{
    let store = factory.create(ManualClock::at_epoch()).await;
    let (business_first, quick) = (event("s", 1), event("s", 2));
    let mut slow = store.begin_write().await.unwrap();
    slow.write_business_row().await.unwrap();
    let mut fast = store.begin_write().await.unwrap();
    fast.enqueue(quick.clone()).await.unwrap();
    fast.commit().await.unwrap();
    slow.enqueue(business_first.clone()).await.unwrap();
    slow.commit().await.unwrap();
    let order = drain(&*store).await;
    assert_eq!(
        order,
        vec![quick.event_id, business_first.event_id],
        "the event written after the other transaction committed goes after it"
    );
}

/// A write transaction left open on the same store that wrote no event
/// (a batch job, an idle session) delays nothing (never wait
/// for strangers).
pub async fn strangers_never_hold_publication<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: BeginWrite,
{
    let store = factory.create(ManualClock::at_epoch()).await;
    let mut stranger = store.begin_write().await.unwrap();
    stranger.write_business_row().await.unwrap();
    let e = event("a", 1);
    enqueue_all(&*store, std::slice::from_ref(&e)).await;
    let claimed = claim(&*store, &request("r1", 10)).await;
    assert_eq!(
        ids(&claimed),
        vec![e.event_id],
        "an open transaction that wrote no event held publication back"
    );
    stranger.commit().await.unwrap();
}
