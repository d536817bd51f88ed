//! [`SqsConsumer`]: a queue runner that feeds an [`InboxStore`].
//!
//! receive (long polling) → begin → inbox claim → handler(tx) → commit →
//! `DeleteMessageBatch`. A message is deleted only after its transaction
//! committed; a consumer that dies in between leaves it to reappear after
//! the visibility timeout, and the inbox absorbs the redelivery.
//!
//! **Ordering.** One consumer handles a received batch one message at a
//! time, in the order SQS returned it, retrying a failing handler in place
//! before moving on. On a FIFO queue SQS returns a group's messages in
//! order and returns none of a group's later messages while earlier ones
//! are held, so a key's events reach the handler in order. Nothing later
//! is ever handled past an unsettled message: when a message cannot be
//! settled (SQS or the inbox store failing, shutdown while waiting), the
//! rest of the batch is handed back unhandled (visibility reset to zero)
//! and SQS delivers the group again from that message.
//!
//! **Visibility.** While a batch is held its messages' visibility is
//! extended every half `visibility_timeout`, so a slow handler does not let
//! SQS deliver them elsewhere.
//!
//! **Dead letters.** A message received more than `max_receives` times, one
//! that is not an outbox event, or one whose handler gave up is sent to
//! `dead_letter_queue_url` wrapped with the error
//! (`{"error", "receive_count", "source_queue", "message_id", "group_id",
//! "body", "attributes"}`), then deleted. `outbox_sns::dead_letters` lists,
//! shows and replays them.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::error::SdkError;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName, QueueAttributeName};
use outbox_core::consume::{Applied, Consuming, default_store_outage, pause_unless_shut_down};
use outbox_core::relay::OutagePolicy;
use outbox_core::{ErrorClass, InboxStore, RetryPolicy, StoreError};
use tokio_util::sync::CancellationToken;

use crate::config::is_fifo;
use crate::error::{classify_sdk_error, describe};
use crate::message::{SqsEvent, receive_count};
use crate::settle;
use crate::visibility::VisibilityKeeper;

pub use outbox_core::consume::HandlerError;

/// The handler a runner calls: [`outbox_core::consume::Handler`] over [`SqsEvent`].
pub use outbox_core::consume::Handler;

/// Consumer settings.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// The queue to read (subscribed to the topic, raw or enveloped).
    pub queue_url: String,
    /// The inbox's consumer name: claims are made under it.
    pub consumer: String,
    /// Where given-up messages go, wrapped with their error.
    pub dead_letter_queue_url: String,
    /// Messages per receive, 1 to 10. Default 10.
    pub batch_size: u32,
    /// Long-polling wait per receive, at most 20 s. Default 10 s.
    pub wait_time: Duration,
    /// Visibility requested per receive and extended while a batch is held,
    /// 2 s to 12 h. Default 30 s.
    pub visibility_timeout: Duration,
    /// Receives after which a message is dead-lettered. Default 10.
    pub max_receives: u32,
    /// In-place retries of a failing handler.
    pub handler_retry: RetryPolicy,
    /// Pauses while the inbox's store or SQS fails with retryable errors;
    /// the same message is retried until they are back (default 100 ms
    /// doubling to 5 s).
    pub store_outage: OutagePolicy,
}

impl ConsumerConfig {
    /// Defaults for `consumer` reading `queue_url`, dead-lettering to
    /// `dead_letter_queue_url`.
    pub fn new(
        queue_url: impl Into<String>,
        consumer: impl Into<String>,
        dead_letter_queue_url: impl Into<String>,
    ) -> Self {
        Self {
            queue_url: queue_url.into(),
            consumer: consumer.into(),
            dead_letter_queue_url: dead_letter_queue_url.into(),
            batch_size: 10,
            wait_time: Duration::from_secs(10),
            visibility_timeout: Duration::from_secs(30),
            max_receives: 10,
            handler_retry: RetryPolicy::in_place(),
            store_outage: default_store_outage(),
        }
    }

    /// Checks the settings can work (the consumer's constructor calls it).
    pub fn validate(&self) -> Result<(), ConsumerError> {
        let fail = |m: &str| Err(ConsumerError::Config(m.to_owned()));
        if self.queue_url.is_empty() || self.consumer.is_empty() {
            return fail("queue_url and consumer must not be empty");
        }
        if self.dead_letter_queue_url.is_empty() || self.dead_letter_queue_url == self.queue_url {
            return fail("dead_letter_queue_url must name another queue");
        }
        if !(1..=10).contains(&self.batch_size) {
            return fail("batch_size must be 1 to 10 (an SQS limit)");
        }
        if self.wait_time > Duration::from_secs(20) {
            return fail("wait_time must be at most 20 s (an SQS limit)");
        }
        if self.visibility_timeout < Duration::from_secs(2)
            || self.visibility_timeout > Duration::from_secs(43_200)
        {
            return fail("visibility_timeout must be 2 s to 12 h");
        }
        if self.max_receives == 0 {
            return fail("max_receives must be at least 1");
        }
        outbox_core::consume::validate_policies(&self.handler_retry, &self.store_outage)
            .map_err(ConsumerError::Config)
    }
}

/// What a consumer did, returned when it stops.
pub type ConsumerReport = outbox_core::consume::ConsumerReport<SqsCounts>;

/// What an SQS consumer counts beside every consumer's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SqsCounts {
    /// Messages received (redeliveries included).
    pub received: u64,
    /// SQS errors ridden out (the consumer waited, then received again).
    pub sqs_retries: u64,
    /// Messages handed back unhandled (a failure or shutdown mid-batch).
    pub handed_back: u64,
    /// Visibility extensions made while handlers ran.
    pub visibility_extensions: u64,
}

outbox_core::consumer_error!(
    /// A queue that does not exist or may not be read (checked at start).
    Sqs(String),
    "sqs: {0}"
);

/// Why a batch was cut short.
enum Failure {
    Sqs(ErrorClass, String),
    /// SQS answered that a queue does not exist or may not be read.
    Refused(String),
    Inbox(StoreError),
}

enum Handled {
    Settled,
    /// Shutdown came first: handed back, delivered again later.
    Interrupted,
}

/// Receives from an SQS queue and applies each event once through an inbox.
pub struct SqsConsumer<I, H> {
    client: aws_sdk_sqs::Client,
    config: ConsumerConfig,
    consuming: Consuming<I, H>,
    report: ConsumerReport,
}

impl<I, H> SqsConsumer<I, H>
where
    I: InboxStore,
    H: Handler<I::Transaction, SqsEvent>,
{
    /// A consumer with the endpoint, region and credentials of `sdk`;
    /// fails on settings that cannot work.
    pub fn new(
        sdk: &aws_types::SdkConfig,
        config: ConsumerConfig,
        inbox: I,
        handler: H,
    ) -> Result<Self, ConsumerError> {
        Self::from_client(aws_sdk_sqs::Client::new(sdk), config, inbox, handler)
    }

    /// A consumer on a client the caller built.
    pub fn from_client(
        client: aws_sdk_sqs::Client,
        config: ConsumerConfig,
        inbox: I,
        handler: H,
    ) -> Result<Self, ConsumerError> {
        config.validate()?;
        Ok(Self {
            client,
            consuming: Consuming::new(inbox, handler, &config.handler_retry, &config.store_outage),
            config,
            report: ConsumerReport::default(),
        })
    }

    /// Runs until `shutdown`: the message in hand is finished first (or, if
    /// it is waiting out an outage, handed back to be delivered again).
    /// SQS errors and retryable inbox-store errors are waited out; a queue
    /// that does not exist or may not be read (at start) or a non-retryable
    /// store error ends the consumer with it.
    pub async fn run(
        mut self,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError> {
        let mut queues_checked = false;
        while !shutdown.is_cancelled() {
            let step = if queues_checked {
                self.step(&shutdown).await
            } else {
                self.check_queues().await.map(|()| queues_checked = true)
            };
            let (class, message) = match step {
                Ok(()) => {
                    self.consuming.step_succeeded();
                    continue;
                }
                Err(Failure::Inbox(error)) => return Err(ConsumerError::Inbox(error)),
                Err(Failure::Refused(message)) => return Err(ConsumerError::Sqs(message)),
                Err(Failure::Sqs(class, message)) => (class, message),
            };
            self.report.broker.sqs_retries += 1;
            let pause = self.consuming.step_failed();
            tracing::warn!(error = %message, class = class.as_str(), ?pause, "sqs failed; consumer waiting");
            pause_unless_shut_down(pause, &shutdown).await;
        }
        Ok(self.report)
    }

    /// Both queues exist and answer: a consumer pointed at a wrong URL
    /// fails at start instead of logging warnings forever.
    async fn check_queues(&self) -> Result<(), Failure> {
        for url in [&self.config.queue_url, &self.config.dead_letter_queue_url] {
            self.client
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::VisibilityTimeout)
                .send()
                .await
                .map_err(|e| {
                    let class = classify_sdk_error(&e);
                    let message = format!("{url}: {}", describe(&e));
                    match e {
                        SdkError::ServiceError(_) if class == ErrorClass::Outage => {
                            Failure::Refused(message)
                        }
                        _ => Failure::Sqs(class, message),
                    }
                })?;
        }
        Ok(())
    }

    /// One receive and the handling of what it brought.
    async fn step(&mut self, shutdown: &CancellationToken) -> Result<(), Failure> {
        let receive = self
            .client
            .receive_message()
            .queue_url(&self.config.queue_url)
            .max_number_of_messages(self.config.batch_size as i32)
            .wait_time_seconds(self.config.wait_time.as_secs() as i32)
            .visibility_timeout(self.config.visibility_timeout.as_secs() as i32)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send();
        // A receive cut short by shutdown may have taken messages: they
        // reappear after the visibility timeout.
        let received = tokio::select! {
            received = receive => received.map_err(|e| Failure::Sqs(classify_sdk_error(&e), describe(&e)))?,
            _ = shutdown.cancelled() => return Ok(()),
        };
        let messages = received.messages.unwrap_or_default();
        if messages.is_empty() {
            return Ok(());
        }
        self.report.broker.received += messages.len() as u64;
        let receipts: Vec<String> = messages
            .iter()
            .filter_map(|m| m.receipt_handle().map(str::to_owned))
            .collect();
        let keeper = VisibilityKeeper::start(
            self.client.clone(),
            self.config.queue_url.clone(),
            self.config.visibility_timeout,
            receipts,
        );
        let mut settled: Vec<&Message> = Vec::new();
        let mut outcome = Ok(());
        for message in &messages {
            if shutdown.is_cancelled() {
                break;
            }
            match self.process(message, shutdown).await {
                Ok(Handled::Settled) => settled.push(message),
                Ok(Handled::Interrupted) => break,
                Err(failure) => {
                    outcome = Err(failure);
                    break;
                }
            }
        }
        // The keeper stops before anything is settled: an extension still
        // in flight could otherwise land after a hand-back and hide one of
        // a group's messages while SQS delivers the ones behind it.
        self.report.broker.visibility_extensions += keeper.stop().await;
        settle::delete(&self.client, &self.config.queue_url, &settled).await;
        let rest = &messages[settled.len()..];
        self.report.broker.handed_back += rest.len() as u64;
        settle::hand_back(&self.client, &self.config.queue_url, rest).await;
        outcome
    }

    async fn process(
        &mut self,
        message: &Message,
        shutdown: &CancellationToken,
    ) -> Result<Handled, Failure> {
        let receives = receive_count(message);
        if receives > self.config.max_receives {
            let reason = format!("received {receives} times");
            return self.dead_letter(message, &reason).await;
        }
        let event = match SqsEvent::decode(message) {
            Ok(event) => event,
            Err(e) => return self.dead_letter(message, &e.to_string()).await,
        };
        let mut applier = self.consuming.applier(&self.config.consumer, shutdown);
        let applied = applier.apply(event.event_id, &event.headers, &event).await;
        self.report.store_retries += applier.store_retries;
        match applied.map_err(Failure::Inbox)? {
            Applied::Applied => self.report.applied += 1,
            Applied::Duplicate => self.report.duplicates += 1,
            Applied::Interrupted => return Ok(Handled::Interrupted),
            Applied::GaveUp(reason) => return self.dead_letter(message, &reason).await,
        }
        Ok(Handled::Settled)
    }

    /// Sends `message` with `reason` to the dead-letter queue.
    async fn dead_letter(&mut self, message: &Message, reason: &str) -> Result<Handled, Failure> {
        let attributes: HashMap<&str, &str> = message
            .message_attributes()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| v.string_value().map(|v| (k.as_str(), v)))
            .collect();
        let group_id = message
            .attributes()
            .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId));
        let wrapped = serde_json::json!({
            "error": reason,
            "receive_count": receive_count(message),
            "source_queue": self.config.queue_url,
            "message_id": message.message_id(),
            "group_id": group_id,
            "body": message.body(),
            "attributes": attributes,
        });
        let mut send = self
            .client
            .send_message()
            .queue_url(&self.config.dead_letter_queue_url)
            .message_body(wrapped.to_string());
        if is_fifo(&self.config.dead_letter_queue_url) {
            let group = message
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                .cloned()
                .unwrap_or_else(|| "outbox-dead-letters".to_owned());
            send = send
                .message_group_id(group)
                .message_deduplication_id(message.message_id().unwrap_or_default());
        }
        send.send()
            .await
            .map_err(|e| Failure::Sqs(classify_sdk_error(&e), describe(&e)))?;
        self.report.dead_lettered += 1;
        tracing::error!(message_id = ?message.message_id(), %reason, "message dead-lettered");
        Ok(Handled::Settled)
    }
}
