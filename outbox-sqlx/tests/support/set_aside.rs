//! The rows a per-key claim sets aside (MariaDB/MySQL and SQLite): rows
//! behind a failed row that blocks their key are parked (status 4), rows
//! behind a head not yet due wait (status 5), so no later claim reads
//! past them again (10,000 blocked keys cost every MariaDB claim 3x the
//! clean drain's time while they stayed pending). A block lifted or a head
//! removed by hand, not through the store, lets them come back all the
//! same, and an unordered claim takes them. Each store's test binary runs
//! these through `set_aside_tests!` with its own [`SetAsideHarness`].

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::store::{FailReason, Nack, NackAction, OutboxStore};
use outbox_core::testing::{event, store_suite};
use outbox_core::{ErrorClass, EventId, ManualClock, Ordering, OutboxWriter};

/// What the tests read and write by hand on one store.
#[async_trait]
pub trait SetAsideHarness: OutboxStore + OutboxWriter + Sized {
    /// A store on fresh tables, on `clock`.
    async fn create(clock: ManualClock) -> Self;
    /// How many rows of `key` have each status, in status order.
    async fn statuses(&self, key: &str) -> Vec<(i64, i64)>;
    /// Runs `sql` (`{events}`: the events table; one `?`: `id`) as
    /// another tool would.
    async fn by_hand(&self, sql: &str, id: EventId);
    /// A new handle on the same tables, as after a restart.
    fn reopened(&self) -> Self;
}

async fn claim_ids(store: &impl OutboxStore, limit: usize) -> Vec<EventId> {
    let claimed = store
        .claim_batch(&store_suite::request("r", limit))
        .await
        .unwrap()
        .events;
    let leases: Vec<_> = claimed.iter().map(|c| c.lease.clone()).collect();
    store.ack(&leases).await.unwrap();
    claimed.iter().map(|c| c.event.event_id).collect()
}

/// Fails key `blocked`'s head (`action`) with `behind` events behind
/// it, and lets one claim meet them beside an event of another key.
async fn hold_with(store: &impl SetAsideHarness, behind: usize, action: NackAction) -> EventId {
    let head = event("blocked", 0);
    OutboxWriter::enqueue(store, std::slice::from_ref(&head))
        .await
        .unwrap();
    let claimed = store
        .claim_batch(&store_suite::request("r", 1))
        .await
        .unwrap()
        .events;
    let fail = Nack {
        lease: claimed[0].lease.clone(),
        action,
        error_class: ErrorClass::Permanent,
        error: "rejected".into(),
    };
    store.nack(&[fail]).await.unwrap();
    let backlog: Vec<_> = (1..=behind).map(|n| event("blocked", n)).collect();
    OutboxWriter::enqueue(store, &backlog).await.unwrap();
    let other = event("other", 0);
    OutboxWriter::enqueue(store, std::slice::from_ref(&other))
        .await
        .unwrap();
    assert_eq!(claim_ids(store, 10).await, vec![other.event_id]);
    head.event_id
}

/// Blocks key `blocked` with `behind` events parked behind its head.
async fn block_with(store: &impl SetAsideHarness, behind: usize) -> EventId {
    let block = NackAction::Fail {
        reason: FailReason::Permanent,
        block_key: true,
    };
    hold_with(store, behind, block).await
}

/// Key `blocked`'s head retries in a minute, `behind` events behind it.
async fn back_off_with(store: &impl SetAsideHarness, behind: usize) -> EventId {
    let after = Duration::from_secs(60);
    hold_with(store, behind, NackAction::Retry { after }).await
}

/// The rows behind the block, those there when a claim met them and those
/// enqueued since, are parked by the claims that meet them; the key's
/// failed head stays failed.
pub async fn claims_park_the_rows_behind_a_blocking_failure<S: SetAsideHarness>() {
    let store = S::create(ManualClock::at_epoch()).await;
    block_with(&store, 50).await;
    assert_eq!(store.statuses("blocked").await, vec![(3, 1), (4, 50)]);
    OutboxWriter::enqueue(&store, &[event("blocked", 51), event("other", 1)])
        .await
        .unwrap();
    assert_eq!(
        claim_ids(&store, 10).await.len(),
        1,
        "the other key's event"
    );
    assert_eq!(store.statuses("blocked").await, vec![(3, 1), (4, 51)]);
}

/// A block lifted by SQL (the failed head marked published by hand): a
/// store handle's first claim sets the parked rows back, in order.
pub async fn rows_parked_behind_a_block_lifted_by_hand_come_back<S: SetAsideHarness>() {
    let store = S::create(ManualClock::at_epoch()).await;
    let head = block_with(&store, 3).await;
    let lift = "UPDATE {events} SET status = 2, blocks_key = FALSE, published_at = 0 \
                WHERE event_id = ?";
    store.by_hand(lift, head).await;
    assert_eq!(claim_ids(&store.reopened(), 10).await.len(), 3);
    assert_eq!(store.statuses("blocked").await, vec![(2, 4)]);
}

/// The rows behind a head that backs off wait aside (status 5); once the
/// head is due, one claim takes it and every row behind it, in order.
pub async fn rows_behind_a_backing_off_head_wait_aside_and_come_back_with_it<S: SetAsideHarness>() {
    let clock = ManualClock::at_epoch();
    let store = S::create(clock.clone()).await;
    let head = back_off_with(&store, 20).await;
    assert_eq!(store.statuses("blocked").await, vec![(0, 1), (5, 20)]);
    clock.advance(Duration::from_secs(61));
    let claimed = claim_ids(&store, 100).await;
    assert_eq!(claimed.len(), 21, "the head and the rows behind it");
    assert_eq!(claimed[0], head);
    assert_eq!(store.statuses("blocked").await, vec![(2, 21)]);
}

/// A head that backs off removed by hand: a store handle's first claim
/// sets back the rows that waited behind it.
pub async fn rows_waiting_behind_a_head_removed_by_hand_come_back<S: SetAsideHarness>() {
    let store = S::create(ManualClock::at_epoch()).await;
    let head = back_off_with(&store, 3).await;
    store
        .by_hand("DELETE FROM {events} WHERE event_id = ?", head)
        .await;
    assert_eq!(claim_ids(&store.reopened(), 10).await.len(), 3);
}

/// An unordered relay honours no key's order: a store handle's first
/// unordered claim sets back the rows per-key claims set aside, and takes
/// them, as it did before they were set aside.
pub async fn an_unordered_claim_takes_the_rows_set_aside<S: SetAsideHarness>() {
    let store = S::create(ManualClock::at_epoch()).await;
    block_with(&store, 3).await;
    let mut request = store_suite::request("u", 10);
    request.ordering = Ordering::Unordered;
    let claimed = store.reopened().claim_batch(&request).await.unwrap().events;
    assert_eq!(claimed.len(), 3);
}

/// One `#[tokio::test]` per function of this module, on harness `$store`.
#[macro_export]
macro_rules! set_aside_tests {
    ($store:ty) => {
        $crate::set_aside_tests!($store;
            claims_park_the_rows_behind_a_blocking_failure,
            rows_parked_behind_a_block_lifted_by_hand_come_back,
            rows_behind_a_backing_off_head_wait_aside_and_come_back_with_it,
            rows_waiting_behind_a_head_removed_by_hand_come_back,
            an_unordered_claim_takes_the_rows_set_aside,
        );
    };
    ($store:ty; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                super::support::set_aside::$name::<$store>().await;
            }
        )+
    };
}
