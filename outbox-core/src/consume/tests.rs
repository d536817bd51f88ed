//! The applier against the in-memory inbox.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::memory::{MemoryInbox, MemoryInboxTx};
use crate::policy::FixedRandom;

/// Counts committed effects, or fails as told.
struct Counting {
    applied: Arc<AtomicU32>,
    calls: AtomicU32,
    fail: Option<HandlerError>,
}

impl Counting {
    fn new(fail: Option<HandlerError>) -> Self {
        Self {
            applied: Arc::default(),
            calls: AtomicU32::new(0),
            fail,
        }
    }
}

#[async_trait::async_trait]
impl Handler<MemoryInboxTx, ()> for Counting {
    async fn handle(&self, tx: &mut MemoryInboxTx, _event: &()) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(failure) = &self.fail {
            return Err(failure.clone());
        }
        let applied = self.applied.clone();
        tx.on_commit(move || {
            applied.fetch_add(1, Ordering::SeqCst);
        });
        Ok(())
    }
}

async fn deliver(inbox: &MemoryInbox, id: EventId, handler: &Counting) -> Applied {
    let shutdown = CancellationToken::new();
    let mut applier = Applier {
        inbox,
        consumer: "c",
        handler,
        handler_retry: &RetryPolicy::immediate(3),
        store_outage: &default_store_outage(),
        random: &FixedRandom(0.5),
        shutdown: &shutdown,
        store_retries: 0,
    };
    applier.apply(id, &Headers::default(), &()).await.unwrap()
}

#[tokio::test]
async fn applies_once_and_recognises_redeliveries() {
    let inbox = MemoryInbox::new();
    let handler = Counting::new(None);
    let id = EventId::random();
    for expected in [Applied::Applied, Applied::Duplicate, Applied::Duplicate] {
        assert_eq!(deliver(&inbox, id, &handler).await, expected);
    }
    assert_eq!(handler.applied.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn retries_in_place_then_gives_up_without_an_effect() {
    let inbox = MemoryInbox::new();
    let handler = Counting::new(Some(HandlerError::Retry("down".into())));
    let got = deliver(&inbox, EventId::random(), &handler).await;
    assert_eq!(got, Applied::GaveUp("down".into()));
    assert_eq!(handler.calls.load(Ordering::SeqCst), 3);
    assert!(inbox.is_empty(), "a given-up event is not claimed");
}

#[tokio::test]
async fn a_rejection_gives_up_at_once_and_a_later_success_applies() {
    let inbox = MemoryInbox::new();
    let id = EventId::random();
    let rejecting = Counting::new(Some(HandlerError::Reject("bad".into())));
    assert_eq!(
        deliver(&inbox, id, &rejecting).await,
        Applied::GaveUp("bad".into())
    );
    assert_eq!(rejecting.calls.load(Ordering::SeqCst), 1);
    let fixed = Counting::new(None);
    assert_eq!(deliver(&inbox, id, &fixed).await, Applied::Applied);
    assert_eq!(fixed.applied.load(Ordering::SeqCst), 1);
}

/// Records committed events in commit order; fails event `fail_at` as
/// told, `times` times.
struct Recording {
    committed: Arc<std::sync::Mutex<Vec<u32>>>,
    fail_at: u32,
    failure: HandlerError,
    times: AtomicU32,
}

#[async_trait::async_trait]
impl Handler<MemoryInboxTx, u32> for Recording {
    async fn handle(&self, tx: &mut MemoryInboxTx, event: &u32) -> Result<(), HandlerError> {
        if *event == self.fail_at && self.times.load(Ordering::SeqCst) > 0 {
            self.times.fetch_sub(1, Ordering::SeqCst);
            return Err(self.failure.clone());
        }
        let committed = self.committed.clone();
        let event = *event;
        tx.on_commit(move || committed.lock().unwrap().push(event));
        Ok(())
    }
}

async fn deliver_batch(
    inbox: &MemoryInbox,
    ids: &[EventId],
    handler: &Recording,
    (retry, shutdown): (&RetryPolicy, &CancellationToken),
) -> Vec<Applied> {
    let headers = Headers::default();
    let events: Vec<u32> = (0..ids.len() as u32).collect();
    let batch: Vec<(EventId, &Headers, &u32)> = ids
        .iter()
        .zip(&events)
        .map(|(id, e)| (*id, &headers, e))
        .collect();
    let mut applier = Applier {
        inbox,
        consumer: "c",
        handler,
        handler_retry: retry,
        store_outage: &default_store_outage(),
        random: &FixedRandom(0.5),
        shutdown,
        store_retries: 0,
    };
    applier.apply_batch(&batch).await.unwrap()
}

/// Three new events, one batch, retried at once, no shutdown.
async fn deliver_three(handler: &Recording) -> Vec<Applied> {
    let ids: Vec<EventId> = (0..3).map(|_| EventId::random()).collect();
    let running = (&RetryPolicy::immediate(3), &CancellationToken::new());
    deliver_batch(&MemoryInbox::new(), &ids, handler, running).await
}

fn recording(fail_at: u32, failure: HandlerError, times: u32) -> Recording {
    Recording {
        committed: Arc::default(),
        fail_at,
        failure,
        times: AtomicU32::new(times),
    }
}

#[tokio::test]
async fn a_batch_applies_in_order_and_recognises_redeliveries_within_and_across() {
    let inbox = MemoryInbox::new();
    let handler = recording(u32::MAX, HandlerError::Retry("never".into()), 0);
    let (a, b) = (EventId::random(), EventId::random());
    let running = (&RetryPolicy::immediate(3), &CancellationToken::new());
    let got = deliver_batch(&inbox, &[a, b, a], &handler, running).await;
    assert_eq!(
        got,
        [Applied::Applied, Applied::Applied, Applied::Duplicate]
    );
    let again = deliver_batch(&inbox, &[b, a], &handler, running).await;
    assert_eq!(again, [Applied::Duplicate, Applied::Duplicate]);
    assert_eq!(*handler.committed.lock().unwrap(), [0, 1]);
}

#[tokio::test]
async fn a_failure_in_a_batch_rolls_it_back_and_each_event_is_applied_once_alone() {
    // Event 1 fails once: the batch rolls back (event 0's effect with
    // it), then each is applied alone, event 1 after one retry.
    let handler = recording(1, HandlerError::Retry("blip".into()), 1);
    let got = deliver_three(&handler).await;
    assert_eq!(got, [Applied::Applied, Applied::Applied, Applied::Applied]);
    assert_eq!(*handler.committed.lock().unwrap(), [0, 1, 2]);
}

#[tokio::test]
async fn a_rejected_event_in_a_batch_gives_up_alone_and_the_others_apply() {
    let handler = recording(1, HandlerError::Reject("bad".into()), u32::MAX);
    let got = deliver_three(&handler).await;
    assert_eq!(
        got,
        [
            Applied::Applied,
            Applied::GaveUp("bad".into()),
            Applied::Applied
        ]
    );
    assert_eq!(*handler.committed.lock().unwrap(), [0, 2]);
}

#[tokio::test]
async fn shutdown_while_an_event_of_a_batch_retries_leaves_it_and_the_rest_unapplied() {
    let inbox = MemoryInbox::new();
    let handler = recording(1, HandlerError::Retry("down".into()), u32::MAX);
    let ids: Vec<EventId> = (0..3).map(|_| EventId::random()).collect();
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    // A pause to wait out (not an immediate retry): shutdown ends it.
    let got = deliver_batch(
        &inbox,
        &ids,
        &handler,
        (&RetryPolicy::in_place(), &shutdown),
    )
    .await;
    assert_eq!(
        got,
        [Applied::Applied, Applied::Interrupted, Applied::Interrupted]
    );
    assert_eq!(*handler.committed.lock().unwrap(), [0]);
}
