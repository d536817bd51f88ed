//! The publisher suite: what every broker adapter must deliver.

use std::time::Duration;

use super::{PublisherHarness, ReceivedEvent};
use crate::event::StoredEvent;
use crate::publisher::{ErrorClass, Publisher};
use crate::testing::fixtures::{event, stored};

/// Every field a consumer needs survives the trip: id, type, key, payload
/// bytes, headers (correlation, traceparent, free ones).
pub async fn round_trips_every_field<H: PublisherHarness>(harness: &H) {
    let events = stored(vec![event("rt-a", 1)]);
    let refs: Vec<&StoredEvent> = events.iter().collect();
    let outcomes = harness.publisher().publish(&refs).await;
    assert_eq!(outcomes.len(), 1);
    assert!(outcomes[0].is_ok(), "{:?}", outcomes[0]);
    let received = harness.read_back(1).await;
    assert_eq!(received[0], ReceivedEvent::expected(&events[0]));
}

/// One outcome per event, and a key's events arrive in the order given.
pub async fn keeps_order_within_a_key<H: PublisherHarness>(harness: &H) {
    let publisher = harness.publisher();
    let max = publisher.capabilities().max_batch.clamp(1, 20);
    let events = stored(
        (0..max * 2)
            .map(|n| event(&format!("ord-{}", n % 2), n))
            .collect(),
    );
    // Without the capability, the relay sends one event per key per call.
    let calls: Vec<Vec<&StoredEvent>> = if publisher.capabilities().preserves_key_order {
        events.chunks(max).map(|c| c.iter().collect()).collect()
    } else {
        events.chunks(2).map(|c| c.iter().collect()).collect()
    };
    for call in &calls {
        let outcomes = publisher.publish(call).await;
        assert_eq!(outcomes.len(), call.len(), "one outcome per event");
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    }
    let received = harness.read_back(events.len()).await;
    for key in ["ord-0", "ord-1"] {
        let sent: Vec<_> = events
            .iter()
            .filter(|e| e.partition_key == key)
            .map(|e| e.event_id)
            .collect();
        let got: Vec<_> = received
            .iter()
            .filter(|e| e.partition_key == key)
            .map(|e| e.event_id)
            .collect();
        assert_eq!(got, sent, "order of key {key}");
    }
}

/// An empty batch is a no-op.
pub async fn empty_batch_is_a_noop<H: PublisherHarness>(harness: &H) {
    assert!(harness.publisher().publish(&[]).await.is_empty());
}

/// A broker that cannot be reached is an **outage** for every event of the
/// call (one outcome each, within 30 s): the relay pauses and burns no
/// attempt. A publisher that calls it transient would spend every event's
/// retries during a broker restart; one that calls it permanent would fail
/// them all.
pub async fn unreachable_broker_is_an_outage<H: PublisherHarness>(harness: &H) {
    let publisher = harness.unreachable_publisher().await;
    let events = stored(vec![
        event("down-a", 1),
        event("down-a", 2),
        event("down-b", 1),
    ]);
    // Without the capability, the relay sends one event per key per call.
    let calls: Vec<Vec<&StoredEvent>> = if publisher.capabilities().preserves_key_order {
        vec![events.iter().collect()]
    } else {
        vec![vec![&events[0], &events[2]], vec![&events[1]]]
    };
    for call in calls {
        let outcomes = tokio::time::timeout(Duration::from_secs(30), publisher.publish(&call))
            .await
            .expect("an unreachable broker is reported within 30 s");
        assert_eq!(outcomes.len(), call.len(), "one outcome per event");
        for outcome in outcomes {
            let class = outcome.expect_err("nothing can be published").class;
            assert_eq!(
                class,
                ErrorClass::Outage,
                "an unreachable broker is an outage"
            );
        }
    }
}
