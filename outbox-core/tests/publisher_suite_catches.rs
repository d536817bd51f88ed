//! The publisher suite fails publishers that break its promises: one that
//! claims to keep a key's order within a call and does not, and one that
//! calls an unreachable broker something other than an outage.

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::memory::RecordingPublisher;
use outbox_core::testing::{
    Faulty, PublishFault, PublisherHarness, ReceivedEvent, RecordingHarness, publisher_suite,
};
use outbox_core::{PublishError, PublishOutcome, Publisher, PublisherCapabilities, StoredEvent};

/// Claims `preserves_key_order` but sends each call's events backwards.
struct Reversing;

#[async_trait]
impl PublishFault<RecordingPublisher> for Reversing {
    fn capabilities(&self, _: &RecordingPublisher) -> PublisherCapabilities {
        PublisherCapabilities {
            max_batch: 20,
            preserves_key_order: true,
        }
    }

    async fn publish(
        &self,
        inner: &RecordingPublisher,
        batch: &[&StoredEvent],
    ) -> Vec<PublishOutcome> {
        let reversed: Vec<&StoredEvent> = batch.iter().rev().copied().collect();
        let mut outcomes = inner.publish(&reversed).await;
        outcomes.reverse();
        outcomes
    }
}

/// Reports an unreachable broker as a transient failure.
struct CallsOutagesTransient;

#[async_trait]
impl Publisher for CallsOutagesTransient {
    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        batch
            .iter()
            .map(|_| Err(PublishError::transient("connection refused")))
            .collect()
    }
}

struct Harness<P> {
    publisher: Arc<P>,
    down: Arc<P>,
    recorded: RecordingPublisher,
}

#[async_trait]
impl<P: Publisher + 'static> PublisherHarness for Harness<P> {
    type Publisher = P;
    fn publisher(&self) -> Arc<P> {
        self.publisher.clone()
    }
    async fn read_back(&self, n: usize) -> Vec<ReceivedEvent> {
        self.recorded.wait_for_deliveries(n).await;
        self.recorded.delivered()[..n]
            .iter()
            .map(ReceivedEvent::expected)
            .collect()
    }
    async fn unreachable_publisher(&self) -> Arc<P> {
        self.down.clone()
    }
}

fn reversing() -> Harness<Faulty<RecordingPublisher, Reversing>> {
    let recorded = RecordingPublisher::new();
    let down = RecordingPublisher::new();
    down.set_outage(true);
    Harness {
        publisher: Arc::new(Faulty::wrap(recorded.clone(), Reversing)),
        down: Arc::new(Faulty::wrap(down, Reversing)),
        recorded,
    }
}

#[tokio::test]
#[should_panic(expected = "order of key")]
async fn a_publisher_that_breaks_its_key_order_promise_fails_the_suite() {
    publisher_suite::keeps_order_within_a_key(&reversing()).await;
}

#[tokio::test]
#[should_panic(expected = "an unreachable broker is an outage")]
async fn a_publisher_that_calls_an_outage_transient_fails_the_suite() {
    let harness = Harness {
        publisher: Arc::new(CallsOutagesTransient),
        down: Arc::new(CallsOutagesTransient),
        recorded: RecordingPublisher::new(),
    };
    publisher_suite::unreachable_broker_is_an_outage(&harness).await;
}

/// The same checks pass for a publisher that keeps both promises, so the
/// two failures above are the faults, not the harness.
#[tokio::test]
async fn an_honest_publisher_passes_both() {
    let honest = RecordingHarness::default();
    publisher_suite::keeps_order_within_a_key(&honest).await;
    publisher_suite::unreachable_broker_is_an_outage(&honest).await;
}
