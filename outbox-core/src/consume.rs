//! Exactly-once application of a delivered event, for consumer runners.
//!
//! Every broker adapter's runner does the same thing per delivery: begin →
//! inbox claim → handler(tx) → commit, retrying a failing handler in place
//! (so a key's later events wait) and giving up to a dead letter. It lives
//! here once, tested on the in-memory inbox; runners add receiving,
//! acknowledging and dead-lettering for their broker.

use crate::error::StoreError;
use crate::event::EventId;
use crate::inbox::InboxStore;
use crate::policy::{RandomSource, RetryDecision, RetryPolicy};

/// What a handler reports for one event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// Try again (with backoff, up to the retry policy's attempts).
    #[error("retry: {0}")]
    Retry(String),
    /// Never going to work: dead-letter now.
    #[error("reject: {0}")]
    Reject(String),
}

/// How one delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The effect committed with the claim.
    Applied,
    /// The inbox had it already: a redelivery, nothing done.
    Duplicate,
    /// The handler rejected it or ran out of retries: dead-letter it.
    GaveUp(String),
}

/// Applies a delivered event `E` inside the inbox transaction `Tx`.
///
/// One trait for every broker: the Redis runner hands it a
/// `StreamEvent`, the Kafka runner a `KafkaEvent`.
#[async_trait::async_trait]
pub trait Handler<Tx: Send, E: Sync>: Send + Sync {
    /// Writes the event's effect through `tx`; it commits with the inbox claim.
    async fn handle(&self, tx: &mut Tx, event: &E) -> Result<(), HandlerError>;
}

/// Applies `event` through `inbox` under `consumer`: the claim and the
/// handler's effect commit together or not at all. A failing handler (or a
/// retryable commit failure) is retried in place per `retry`.
pub async fn apply_once<I, H, E>(
    inbox: &I,
    consumer: &str,
    event_id: EventId,
    event: &E,
    handler: &H,
    retry: &RetryPolicy,
    random: &dyn RandomSource,
) -> Result<Applied, StoreError>
where
    I: InboxStore + ?Sized,
    H: Handler<I::Transaction, E> + ?Sized,
    E: Sync,
{
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let mut tx = inbox.begin().await?;
        if !inbox.claim(&mut tx, consumer, event_id).await? {
            inbox.rollback(tx).await?;
            return Ok(Applied::Duplicate);
        }
        let failure = match handler.handle(&mut tx, event).await {
            Ok(()) => match inbox.commit(tx).await {
                Ok(()) => return Ok(Applied::Applied),
                Err(e) if e.is_retryable() => HandlerError::Retry(e.to_string()),
                Err(e) => return Err(e),
            },
            Err(failure) => {
                inbox.rollback(tx).await?;
                failure
            }
        };
        match failure {
            HandlerError::Reject(reason) => return Ok(Applied::GaveUp(reason)),
            HandlerError::Retry(reason) => match retry.decide(attempt, random) {
                RetryDecision::RetryAfter(pause) => {
                    tracing::warn!(%event_id, %reason, ?pause, "handler failed; retrying");
                    tokio::time::sleep(pause).await;
                }
                RetryDecision::GiveUp => return Ok(Applied::GaveUp(reason)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
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
        apply_once(
            inbox,
            "c",
            id,
            &(),
            handler,
            &RetryPolicy::immediate(3),
            &FixedRandom(0.5),
        )
        .await
        .unwrap()
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
}
