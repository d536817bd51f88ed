//! Exactly-once application of a delivered event, for consumer runners.
//!
//! Every broker adapter's runner does the same thing per delivery: begin →
//! inbox claim → handler(tx) → commit, retrying in place so a key's later
//! events wait, and giving up to a dead letter only when the *handler* gives
//! up. It lives here once, tested on the in-memory inbox; runners add
//! receiving, acknowledging and dead-lettering for their broker.
//!
//! **Two kinds of failure, two policies.** A handler that fails is retried per
//! [`RetryPolicy`] and then dead-lettered: the event is the problem. A store
//! that fails with a retryable error (connection lost, pool timed out, server
//! restarting, serialization failure) is retried per [`OutagePolicy`] for as
//! long as it takes, on the same event, burning none of the handler's
//! attempts: the store is the problem, and no event is ever skipped or
//! dead-lettered because a database restarted. A non-retryable store error
//! ends the runner with that error.

use tokio_util::sync::CancellationToken;

/// `consumer_error!`: a broker's `ConsumerError`.
mod consumer_error;
/// What every broker's consumer holds beside its client.
mod consuming;
mod report;

pub use consuming::{Consuming, pause_unless_shut_down};
pub use report::{ConsumerReport, Handled};

use crate::error::StoreError;
use crate::event::{EventId, Headers};
use crate::inbox::InboxStore;
use crate::policy::{RandomSource, RetryDecision, RetryPolicy};
use crate::relay::OutagePolicy;

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
    /// Shutdown came while waiting to retry: nothing committed, so the
    /// runner must not acknowledge the message (it is delivered again).
    Interrupted,
}

impl Applied {
    /// The outcome's label in the deliveries metric.
    fn label(&self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Duplicate => "duplicate",
            Self::GaveUp(_) => "gave_up",
            Self::Interrupted => "interrupted",
        }
    }
}

/// Applies a delivered event `E` inside the inbox transaction `Tx`.
///
/// One trait for every broker: the Redis runner hands it a
/// `StreamEvent`, the Kafka runner a `KafkaEvent`, the SQS runner an
/// `SqsEvent`. Write the effect on `tx` (for `PgInbox`, a
/// `sqlx::Transaction<'static, Postgres>`): it commits with the inbox claim
/// or not at all.
///
/// ```
/// use outbox_core::consume::{Handler, HandlerError};
///
/// /// The event a runner decoded (each broker crate has its own type).
/// struct Paid {
///     invoice: String,
///     amount_cents: i64,
/// }
///
/// /// A transaction of some store; `Vec` stands in for SQL here.
/// struct Ledger(Vec<(String, i64)>);
///
/// struct RecordRevenue;
///
/// #[async_trait::async_trait]
/// impl Handler<Ledger, Paid> for RecordRevenue {
///     async fn handle(&self, tx: &mut Ledger, event: &Paid) -> Result<(), HandlerError> {
///         if event.amount_cents < 0 {
///             // Never going to work: dead-letter it now.
///             return Err(HandlerError::Reject(format!("negative amount on {}", event.invoice)));
///         }
///         // A failure worth retrying would be HandlerError::Retry.
///         tx.0.push((event.invoice.clone(), event.amount_cents));
///         Ok(())
///     }
/// }
/// # let mut tx = Ledger(Vec::new());
/// # let paid = Paid { invoice: "inv-1".into(), amount_cents: 1200 };
/// # futures::executor::block_on(RecordRevenue.handle(&mut tx, &paid)).unwrap();
/// # assert_eq!(tx.0, vec![("inv-1".to_string(), 1200)]);
/// ```
#[async_trait::async_trait]
pub trait Handler<Tx: Send, E: Sync>: Send + Sync {
    /// Writes the event's effect through `tx`; it commits with the inbox claim.
    async fn handle(&self, tx: &mut Tx, event: &E) -> Result<(), HandlerError>;
}

/// What names an event a consumer runner hands its handler: the inbox's
/// key and the ordering key. Every broker's event type implements it, so
/// one handler can serve events from any of them.
pub trait Consumed {
    /// The event id (the inbox's key).
    fn event_id(&self) -> EventId;
    /// The ordering key.
    fn partition_key(&self) -> &str;
}

/// Implements [`Consumed`] for an event type with the fields
/// `event_id: EventId` and `partition_key: String`, as every broker
/// adapter's event has.
#[macro_export]
macro_rules! consumed_from_fields {
    ($event:ty) => {
        impl $crate::consume::Consumed for $event {
            fn event_id(&self) -> $crate::EventId {
                self.event_id
            }
            fn partition_key(&self) -> &str {
                &self.partition_key
            }
        }
    };
}

pub mod metrics;

/// The pause between retries of an unavailable inbox store, for consumers:
/// 100 ms doubling to 5 s (a consumer resumes soon after its database does).
pub fn default_store_outage() -> OutagePolicy {
    OutagePolicy {
        initial_pause: std::time::Duration::from_millis(100),
        max_pause: std::time::Duration::from_secs(5),
    }
}

/// Checks the two policies every consumer runner takes (the handler's
/// retries, the store's outage pauses); runners call it from their own
/// settings' validation, beside their broker-specific checks.
pub fn validate_policies(
    handler_retry: &RetryPolicy,
    store_outage: &OutagePolicy,
) -> Result<(), String> {
    store_outage.validate("store_outage")?;
    handler_retry.validate()
}

/// Applies deliveries through an inbox under one consumer name; the claim
/// and the handler's effect commit together or not at all.
pub struct Applier<'a, I: ?Sized, H: ?Sized> {
    /// The inbox the claims commit in.
    pub inbox: &'a I,
    /// The consumer (group) name claims are made under.
    pub consumer: &'a str,
    /// What applies an event.
    pub handler: &'a H,
    /// In-place retries of a failing handler, then the event is given up.
    pub handler_retry: &'a RetryPolicy,
    /// Pauses while the store fails with retryable errors (never gives up).
    pub store_outage: &'a OutagePolicy,
    /// Jitter for both.
    pub random: &'a dyn RandomSource,
    /// Cuts a pause short: the delivery ends [`Applied::Interrupted`].
    pub shutdown: &'a CancellationToken,
    /// Retryable store errors ridden out so far (for reports and tests).
    pub store_retries: u64,
}

/// Why one transaction attempt did not settle the delivery.
enum Attempt {
    Done(Applied),
    HandlerFailed(HandlerError),
    StoreFailed(StoreError),
}

impl<I, H> Applier<'_, I, H>
where
    I: InboxStore + ?Sized,
    H: ?Sized,
{
    /// Applies `event` (identified by `event_id`) once: a redelivery is a
    /// [`Applied::Duplicate`]; a failing handler is retried in place, then
    /// given up; a retryable store error is waited out on this same event.
    /// Errs only with a non-retryable store error.
    ///
    /// Runs inside a [`CONSUME_SPAN`](crate::trace::CONSUME_SPAN); with the
    /// `otel` feature that span is a child of the trace context in
    /// `headers`, so the handler's spans join the producer's trace.
    pub async fn apply<E>(
        &mut self,
        event_id: EventId,
        headers: &Headers,
        event: &E,
    ) -> Result<Applied, StoreError>
    where
        H: Handler<I::Transaction, E>,
        E: Sync,
    {
        let span = crate::trace::consume_span(self.consumer, &event_id, headers);
        let applied = tracing::Instrument::instrument(self.apply_once(event_id, event), span).await;
        if let Ok(applied) = &applied {
            metrics::delivery(self.consumer, applied.label());
        }
        applied
    }

    async fn apply_once<E>(&mut self, event_id: EventId, event: &E) -> Result<Applied, StoreError>
    where
        H: Handler<I::Transaction, E>,
        E: Sync,
    {
        let mut handler_failures = 0u32;
        let mut store_failures = 0u32;
        loop {
            let pause = match self.attempt(event_id, event).await {
                Attempt::Done(applied) => return Ok(applied),
                Attempt::StoreFailed(error) if error.is_retryable() => {
                    store_failures += 1;
                    self.store_retries += 1;
                    metrics::count(metrics::STORE_RETRIES, self.consumer);
                    let pause = self.store_outage.pause(store_failures, self.random);
                    tracing::warn!(%event_id, %error, ?pause, "inbox store unavailable; retrying the same event");
                    pause
                }
                Attempt::StoreFailed(error) => return Err(error),
                Attempt::HandlerFailed(HandlerError::Reject(reason)) => {
                    return Ok(Applied::GaveUp(reason));
                }
                Attempt::HandlerFailed(HandlerError::Retry(reason)) => {
                    handler_failures += 1;
                    match self.handler_retry.decide(handler_failures, self.random) {
                        RetryDecision::RetryAfter(pause) => {
                            metrics::count(metrics::HANDLER_RETRIES, self.consumer);
                            tracing::warn!(%event_id, %reason, ?pause, "handler failed; retrying");
                            pause
                        }
                        RetryDecision::GiveUp => return Ok(Applied::GaveUp(reason)),
                    }
                }
            };
            if !pause_unless_shut_down(pause, self.shutdown).await {
                return Ok(Applied::Interrupted);
            }
        }
    }

    /// Applies `events` in order, in one inbox transaction when it can: one
    /// commit for the lot instead of one each (a broker consumer's
    /// throughput is its commits). A handler that fails or a store error
    /// rolls the whole transaction back, and the events are applied again
    /// one at a time with [`apply`](Self::apply)'s retries and give-ups, so
    /// each event's outcome is what it would have been alone; the handler
    /// may then see an event of the batch twice, the first time rolled back.
    ///
    /// Returns one outcome per event, in order. After an
    /// [`Applied::Interrupted`] every later event is `Interrupted` too
    /// (nothing of theirs committed: the runner leaves them to be delivered
    /// again). Errs only with a non-retryable store error.
    pub async fn apply_batch<E>(
        &mut self,
        events: &[(EventId, &Headers, &E)],
    ) -> Result<Vec<Applied>, StoreError>
    where
        H: Handler<I::Transaction, E>,
        E: Sync,
    {
        if events.len() > 1 {
            match self.attempt_batch(events).await {
                Ok(outcomes) => {
                    for outcome in &outcomes {
                        metrics::delivery(self.consumer, outcome.label());
                    }
                    return Ok(outcomes);
                }
                Err(Some(error)) if !error.is_retryable() => return Err(error),
                Err(Some(error)) => {
                    // Retried at once, one event at a time (each waits
                    // the outage out on its own).
                    self.store_retries += 1;
                    metrics::count(metrics::STORE_RETRIES, self.consumer);
                    tracing::warn!(%error, events = events.len(), "inbox store failed a batch; applying its events one at a time");
                }
                Err(None) => {}
            }
        }
        let mut outcomes = Vec::with_capacity(events.len());
        for &(event_id, headers, event) in events {
            let outcome = if outcomes.last() == Some(&Applied::Interrupted) {
                Applied::Interrupted
            } else {
                self.apply(event_id, headers, event).await?
            };
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// One transaction for every event of the batch. Errs if anything
    /// failed: with the store's error, or `None` for a handler's (then
    /// nothing committed, or, if a commit's reply was lost, the inbox rows
    /// make the one-at-a-time pass find the events applied).
    async fn attempt_batch<E>(
        &self,
        events: &[(EventId, &Headers, &E)],
    ) -> Result<Vec<Applied>, Option<StoreError>>
    where
        H: Handler<I::Transaction, E>,
        E: Sync,
    {
        let mut tx = self.inbox.begin().await?;
        let mut outcomes = Vec::with_capacity(events.len());
        for &(event_id, headers, event) in events {
            let span = crate::trace::consume_span(self.consumer, &event_id, headers);
            let step = self.claim_and_handle(&mut tx, event_id, event);
            match tracing::Instrument::instrument(step, span).await {
                Attempt::Done(outcome) => outcomes.push(outcome),
                failure => {
                    let _ = self.inbox.rollback(tx).await;
                    return Err(match failure {
                        Attempt::StoreFailed(error) => Some(error),
                        _ => None,
                    });
                }
            }
        }
        self.inbox.commit(tx).await?;
        Ok(outcomes)
    }

    /// One transaction: begin, claim, handle, commit (or roll back).
    async fn attempt<E>(&self, event_id: EventId, event: &E) -> Attempt
    where
        H: Handler<I::Transaction, E>,
        E: Sync,
    {
        let mut tx = match self.inbox.begin().await {
            Ok(tx) => tx,
            Err(error) => return Attempt::StoreFailed(error),
        };
        match self.claim_and_handle(&mut tx, event_id, event).await {
            Attempt::Done(Applied::Applied) => match self.inbox.commit(tx).await {
                Ok(()) => Attempt::Done(Applied::Applied),
                Err(error) => Attempt::StoreFailed(error),
            },
            Attempt::StoreFailed(error) => {
                // The transaction is unusable either way.
                let _ = self.inbox.rollback(tx).await;
                Attempt::StoreFailed(error)
            }
            // A duplicate or a handler's failure: nothing to keep.
            other => match self.inbox.rollback(tx).await {
                Ok(()) => other,
                Err(error) => Attempt::StoreFailed(error),
            },
        }
    }

    /// Inside `tx`: the inbox claim, then (if the event is new) the handler.
    /// `Done` is `Applied` or `Duplicate`; the caller ends the transaction.
    async fn claim_and_handle<E>(
        &self,
        tx: &mut I::Transaction,
        event_id: EventId,
        event: &E,
    ) -> Attempt
    where
        H: Handler<I::Transaction, E>,
        E: Sync,
    {
        match self.inbox.claim(tx, self.consumer, event_id).await {
            Ok(true) => {}
            Ok(false) => return Attempt::Done(Applied::Duplicate),
            Err(error) => return Attempt::StoreFailed(error),
        }
        let started = std::time::Instant::now();
        let handled = self.handler.handle(tx, event).await;
        metrics::handler_seconds(self.consumer, started.elapsed());
        match handled {
            Ok(()) => Attempt::Done(Applied::Applied),
            Err(failure) => Attempt::HandlerFailed(failure),
        }
    }
}

#[cfg(test)]
mod tests;
