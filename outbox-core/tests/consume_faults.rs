//! The shared consume loop under store faults: a retryable store error is
//! waited out on the same event (never skipped, never dead-lettered, no
//! handler attempt burned); a non-retryable one ends the delivery with it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consume::{Applied, Applier, Handler, HandlerError};
use outbox_core::memory::{MemoryInbox, MemoryInboxTx};
use outbox_core::policy::FixedRandom;
use outbox_core::relay::OutagePolicy;
use outbox_core::testing::FlakyInbox;
use outbox_core::{CancellationToken, EventId, Headers, InboxStore, RetryPolicy, StoreError};

/// Records the sequence numbers whose effects committed, in commit order.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Vec<u32>>>);

#[async_trait]
impl Handler<MemoryInboxTx, u32> for Recording {
    async fn handle(&self, tx: &mut MemoryInboxTx, seq: &u32) -> Result<(), HandlerError> {
        let applied = self.0.clone();
        let seq = *seq;
        tx.on_commit(move || applied.lock().unwrap().push(seq));
        Ok(())
    }
}

fn quick_outage() -> OutagePolicy {
    OutagePolicy {
        initial_pause: Duration::from_millis(1),
        max_pause: Duration::from_millis(2),
    }
}

#[tokio::test]
async fn a_flaky_store_is_waited_out_on_the_same_event_in_order() {
    let inbox = FlakyInbox::new(MemoryInbox::new(), 3);
    let injected = inbox.injected.clone();
    let handler = Recording::default();
    let shutdown = CancellationToken::new();
    // One handler attempt: a store failure counted against the handler
    // would give the event up at once.
    let handler_retry = RetryPolicy::immediate(1);
    let store_outage = quick_outage();
    let mut applier = Applier {
        inbox: &inbox,
        consumer: "billing",
        handler: &handler,
        handler_retry: &handler_retry,
        store_outage: &store_outage,
        random: &FixedRandom(0.5),
        shutdown: &shutdown,
        store_retries: 0,
    };
    let ids: Vec<EventId> = (0..60).map(|_| EventId::random()).collect();
    for (seq, id) in ids.iter().enumerate() {
        let outcome = applier
            .apply(*id, &Headers::default(), &(seq as u32))
            .await
            .expect("retryable errors are ridden out");
        // A commit that succeeded but reported a lost connection comes back
        // as a duplicate on the retry: applied once either way.
        assert!(
            matches!(outcome, Applied::Applied | Applied::Duplicate),
            "event {seq} ended {outcome:?}"
        );
    }
    let applied = handler.0.lock().unwrap().clone();
    assert_eq!(
        applied,
        (0..60).collect::<Vec<u32>>(),
        "each event once, in order"
    );
    let injected = injected.load(std::sync::atomic::Ordering::SeqCst) as u64;
    assert!(injected >= 20, "the fault was injected ({injected} times)");
    assert_eq!(
        applier.store_retries, injected,
        "every injected failure was retried"
    );
}

/// An inbox whose store refuses everything, retryably or not.
struct Refusing {
    retryable: bool,
}

#[async_trait]
impl InboxStore for Refusing {
    type Transaction = MemoryInboxTx;

    async fn begin(&self) -> Result<MemoryInboxTx, StoreError> {
        Err(if self.retryable {
            StoreError::Unavailable("connection refused".into())
        } else {
            StoreError::fatal("relation \"inbox\" does not exist")
        })
    }

    async fn claim(&self, _: &mut MemoryInboxTx, _: &str, _: EventId) -> Result<bool, StoreError> {
        unreachable!("begin always fails")
    }

    async fn commit(&self, _: MemoryInboxTx) -> Result<(), StoreError> {
        unreachable!("begin always fails")
    }

    async fn rollback(&self, _: MemoryInboxTx) -> Result<(), StoreError> {
        unreachable!("begin always fails")
    }

    async fn purge_older_than(&self, _: Duration, _: usize) -> Result<u64, StoreError> {
        Ok(0)
    }
}

async fn deliver_to(
    inbox: &Refusing,
    shutdown: &CancellationToken,
) -> (Result<Applied, StoreError>, u64) {
    let handler = Recording::default();
    let handler_retry = RetryPolicy::immediate(1);
    let store_outage = quick_outage();
    let mut applier = Applier {
        inbox,
        consumer: "billing",
        handler: &handler,
        handler_retry: &handler_retry,
        store_outage: &store_outage,
        random: &FixedRandom(0.5),
        shutdown,
        store_retries: 0,
    };
    let outcome = applier
        .apply(EventId::random(), &Headers::default(), &0)
        .await;
    assert!(handler.0.lock().unwrap().is_empty(), "nothing applied");
    (outcome, applier.store_retries)
}

#[tokio::test]
async fn a_non_retryable_store_error_ends_the_delivery_with_it() {
    let (outcome, retries) =
        deliver_to(&Refusing { retryable: false }, &CancellationToken::new()).await;
    let error = outcome.expect_err("a missing table is not waited out");
    assert!(!error.is_retryable());
    assert!(error.to_string().contains("does not exist"), "{error}");
    assert_eq!(retries, 0);
}

#[tokio::test]
async fn shutdown_interrupts_an_outage_without_an_effect_or_an_acknowledgement() {
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.cancel();
    });
    let (outcome, retries) = deliver_to(&Refusing { retryable: true }, &shutdown).await;
    assert_eq!(outcome.unwrap(), Applied::Interrupted);
    assert!(retries >= 10, "kept retrying until shutdown ({retries})");
}
