//! The inbox suite: exactly-once effects over redelivery.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::InboxHarness;
use crate::clock::ManualClock;
use crate::error::StoreError;
use crate::event::EventId;
use crate::inbox::InboxStore;

/// Builds a fresh, isolated inbox harness on the given clock.
pub trait InboxFactory: Send + Sync {
    /// The harness type.
    type Harness: InboxHarness;
    /// A new empty inbox.
    fn create(&self, clock: ManualClock) -> impl Future<Output = Arc<Self::Harness>> + Send;
}

impl<F, Fut, H> InboxFactory for F
where
    F: Fn(ManualClock) -> Fut + Send + Sync,
    Fut: Future<Output = Arc<H>> + Send,
    H: InboxHarness,
{
    type Harness = H;
    fn create(&self, clock: ManualClock) -> impl Future<Output = Arc<H>> + Send {
        self(clock)
    }
}

/// What a consumer runner does with one delivery: claim and apply in one
/// transaction. Returns whether the effect was applied.
pub async fn deliver<H: InboxHarness + ?Sized>(
    harness: &H,
    consumer: &str,
    event_id: EventId,
) -> Result<bool, StoreError> {
    let inbox = harness.inbox();
    let mut tx = inbox.begin().await?;
    if !inbox.claim(&mut tx, consumer, event_id).await? {
        inbox.rollback(tx).await?;
        return Ok(false);
    }
    harness.apply_effect(&mut tx, consumer, event_id).await?;
    inbox.commit(tx).await?;
    Ok(true)
}

/// The first claim wins; later ones report "already applied"; consumers are independent.
pub async fn claims_once_per_consumer<F: InboxFactory>(factory: &F) {
    let h = factory.create(ManualClock::at_epoch()).await;
    let id = EventId::random();
    assert!(deliver(&*h, "dunning", id).await.unwrap());
    assert!(!deliver(&*h, "dunning", id).await.unwrap());
    assert!(
        deliver(&*h, "revenue", id).await.unwrap(),
        "another consumer applies it too"
    );
    assert_eq!(h.effects("dunning").await.unwrap(), vec![id]);
    assert_eq!(h.effects("revenue").await.unwrap(), vec![id]);
}

/// Rolling back drops the claim and the effect together.
pub async fn rollback_drops_claim_and_effect<F: InboxFactory>(factory: &F) {
    let h = factory.create(ManualClock::at_epoch()).await;
    let inbox = h.inbox();
    let id = EventId::random();
    let mut tx = inbox.begin().await.unwrap();
    assert!(inbox.claim(&mut tx, "c", id).await.unwrap());
    h.apply_effect(&mut tx, "c", id).await.unwrap();
    inbox.rollback(tx).await.unwrap();
    assert!(h.effects("c").await.unwrap().is_empty());
    assert!(
        deliver(&*h, "c", id).await.unwrap(),
        "a rolled-back claim does not count"
    );
    assert_eq!(h.effects("c").await.unwrap(), vec![id]);
}

/// Many redeliveries, one effect.
pub async fn redeliveries_apply_once<F: InboxFactory>(factory: &F) {
    let h = factory.create(ManualClock::at_epoch()).await;
    let ids: Vec<EventId> = (0..20).map(|_| EventId::random()).collect();
    for round in 0..3 {
        for id in &ids {
            let applied = deliver(&*h, "c", *id).await.unwrap();
            assert_eq!(applied, round == 0);
        }
    }
    assert_eq!(h.effects("c").await.unwrap(), ids);
}

/// Concurrent deliveries of one event apply it once (losers see "applied"
/// or a retryable conflict, never a second effect).
pub async fn concurrent_deliveries_apply_once<F: InboxFactory>(factory: &F) {
    let h = factory.create(ManualClock::at_epoch()).await;
    let id = EventId::random();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                match deliver(&*h, "c", id).await {
                    Ok(applied) => return applied,
                    Err(e) if e.is_retryable() => tokio::task::yield_now().await,
                    Err(e) => panic!("non-retryable error: {e}"),
                }
            }
        }));
    }
    let mut applied = 0;
    for task in tasks {
        applied += usize::from(task.await.unwrap());
    }
    assert_eq!(applied, 1);
    assert_eq!(h.effects("c").await.unwrap(), vec![id]);
}

/// Retention deletes only claims older than the window, in bounded batches.
pub async fn purge_respects_the_window<F: InboxFactory>(factory: &F) {
    let h = factory.create(ManualClock::at_epoch()).await;
    let old: Vec<EventId> = (0..5).map(|_| EventId::random()).collect();
    for id in &old {
        deliver(&*h, "c", *id).await.unwrap();
    }
    h.clock().advance(Duration::from_secs(3600));
    let young = EventId::random();
    deliver(&*h, "c", young).await.unwrap();
    let window = Duration::from_secs(1800);
    let mut purged = 0;
    loop {
        let n = h.inbox().purge_older_than(window, 2).await.unwrap();
        assert!(n <= 2);
        if n == 0 {
            break;
        }
        purged += n;
    }
    assert_eq!(purged, 5);
    assert!(
        !deliver(&*h, "c", young).await.unwrap(),
        "claims inside the window survive"
    );
    assert!(
        deliver(&*h, "c", old[0]).await.unwrap(),
        "past the window a replay is applied again"
    );
}
