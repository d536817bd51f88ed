//! The SQS consumer runner against the emulator (`scripts/sns.sh`): SNS
//! topic → subscribed queue → inbox, raw and enveloped, with SQS and inbox
//! faults injected mid-batch, slow handlers and dead letters.

#[path = "../support/mod.rs"]
mod support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::memory::{MemoryInbox, MemoryInboxTx};
use outbox_core::testing::stored;
use outbox_core::testing::{FlakyInbox, assert_exactly_once_in_key_order, event, events_over_keys};
use outbox_core::{CancellationToken, EventId, NewEvent, Publisher, StoredEvent};
use outbox_sns::{
    ConsumerConfig, ConsumerError, ConsumerReport, Handler, HandlerError, SnsPublisher,
    SqsConsumer, SqsEvent, TopicRouter,
};
use support::proxy::{FaultProxy, Reply};
use support::{Aws, sdk_config, unique};

mod dead_letters;

const DEADLINE: Duration = Duration::from_secs(60);

async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Effects committed with the inbox claim: (partition key, event id), in
/// commit order. Rejects the events it is told to; sleeps as told.
#[derive(Clone, Default)]
struct Effects {
    applied: Arc<Mutex<Vec<(String, EventId)>>>,
    reject: Arc<Mutex<HashSet<EventId>>>,
    slow: Option<Duration>,
    changed: Arc<tokio::sync::Notify>,
}

impl Effects {
    fn applied(&self) -> Vec<(String, EventId)> {
        self.applied.lock().unwrap().clone()
    }

    async fn wait_for(&self, n: usize) {
        within(&format!("{n} effects"), async {
            loop {
                let changed = self.changed.notified();
                if self.applied.lock().unwrap().len() >= n {
                    return;
                }
                changed.await;
            }
        })
        .await
    }
}

#[async_trait]
impl Handler<MemoryInboxTx, SqsEvent> for Effects {
    async fn handle(&self, tx: &mut MemoryInboxTx, event: &SqsEvent) -> Result<(), HandlerError> {
        if self.reject.lock().unwrap().contains(&event.event_id) {
            return Err(HandlerError::Reject("rejected by the test".into()));
        }
        if let Some(pause) = self.slow {
            tokio::time::sleep(pause).await;
        }
        let applied = self.applied.clone();
        let changed = self.changed.clone();
        let effect = (event.partition_key.clone(), event.event_id);
        tx.on_commit(move || {
            applied.lock().unwrap().push(effect);
            changed.notify_waiters();
        });
        Ok(())
    }
}

/// A queue subscribed to a topic, its dead-letter queue, and a publisher.
struct Setup {
    aws: Aws,
    queue_url: String,
    dead_letter_url: String,
    publisher: SnsPublisher,
}

async fn setup(fifo: bool, raw: bool) -> Setup {
    let aws = Aws::connect().await;
    let subscribed = aws.topic_with_queue("cons", fifo, raw).await;
    let suffix = if fifo { ".fifo" } else { "" };
    let dead_letter_url = aws
        .create_queue(&format!("{}{suffix}", unique("dlq")))
        .await;
    let publisher = SnsPublisher::new(&aws.config, TopicRouter::to(&subscribed.topic_arn));
    Setup {
        aws,
        queue_url: subscribed.queue_url,
        dead_letter_url,
        publisher,
    }
}

impl Setup {
    fn config(&self, consumer: &str) -> ConsumerConfig {
        let mut config = ConsumerConfig::new(&self.queue_url, consumer, &self.dead_letter_url);
        config.wait_time = Duration::from_secs(1);
        config
    }

    /// Publishes `events` one call per event, in order (as the relay does
    /// for a key's events), so FIFO groups hold them in enqueue order.
    async fn publish_in_order(&self, events: &[NewEvent]) -> Vec<StoredEvent> {
        let stored = stored(events.to_vec());
        for event in &stored {
            let outcomes = self.publisher.publish(&[event]).await;
            assert!(outcomes[0].is_ok(), "{outcomes:?}");
        }
        stored
    }

    /// The dead-letter queue's messages, each a JSON wrapper.
    async fn dead_letters(&self, n: usize) -> Vec<serde_json::Value> {
        self.aws
            .drain(&self.dead_letter_url, n)
            .await
            .iter()
            .map(|m| serde_json::from_str(m.body().unwrap()).unwrap())
            .collect()
    }
}

fn spawn<I, H>(
    consumer: SqsConsumer<I, H>,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<ConsumerReport, ConsumerError>>,
)
where
    I: outbox_core::InboxStore + 'static,
    H: Handler<I::Transaction, SqsEvent> + 'static,
{
    let stop = CancellationToken::new();
    let handle = tokio::spawn(consumer.run(stop.clone()));
    (stop, handle)
}

async fn stop(
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<Result<ConsumerReport, ConsumerError>>,
) -> ConsumerReport {
    stop.cancel();
    within("consumer shutdown", handle).await.unwrap().unwrap()
}

/// Standard topic, default (enveloped) subscription: every event applied
/// once, headers read from inside the envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enveloped_subscription_feeds_the_inbox_once() {
    let setup = setup(false, false).await;
    let events = events_over_keys(40, 8);
    let stored = stored(events.clone());
    let refs: Vec<&StoredEvent> = stored.iter().collect();
    for chunk in refs.chunks(20) {
        assert!(
            setup
                .publisher
                .publish(chunk)
                .await
                .iter()
                .all(Result::is_ok)
        );
    }
    let effects = Effects::default();
    let consumer = SqsConsumer::new(
        &setup.aws.config,
        setup.config("billing"),
        MemoryInbox::new(),
        effects.clone(),
    )
    .unwrap();
    let (token, handle) = spawn(consumer);
    effects.wait_for(40).await;
    let report = stop(token, handle).await;
    assert_eq!(
        (report.applied, report.dead_lettered),
        (40, 0),
        "{report:?}"
    );
    let applied: HashSet<EventId> = effects.applied().iter().map(|(_, id)| *id).collect();
    let sent: HashSet<EventId> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(applied, sent);
    assert_eq!(
        setup.aws.depth(&setup.queue_url).await,
        0,
        "every message deleted"
    );
}

/// FIFO queue, faults mid-batch: every 4th SQS request fails (receives,
/// deletes, hand-backs) and every 5th inbox operation fails. The consumer
/// rides both out, is shut down halfway and a second one takes over; each
/// key's events reach the handler once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_mid_batch_and_a_restart_keep_group_order_and_apply_once() {
    let setup = setup(true, true).await;
    let events = events_over_keys(60, 3);
    setup.publish_in_order(&events).await;
    let proxy = FaultProxy::start(&support::endpoint()).await;
    proxy.every(4, Reply::sqs_error(500, "InternalError"));
    let faulty = sdk_config(&proxy.url());
    let effects = Effects::default();
    let mut config = setup.config("billing");
    config.visibility_timeout = Duration::from_secs(2);
    let inbox = MemoryInbox::new();

    let first = SqsConsumer::new(
        &faulty,
        config.clone(),
        FlakyInbox::new(inbox.clone(), 5),
        effects.clone(),
    )
    .unwrap();
    let (token, handle) = spawn(first);
    effects.wait_for(30).await;
    let first = stop(token, handle).await;

    let second = SqsConsumer::new(
        &faulty,
        config,
        FlakyInbox::new(inbox.clone(), 5),
        effects.clone(),
    )
    .unwrap();
    let (token, handle) = spawn(second);
    effects.wait_for(60).await;
    let second = stop(token, handle).await;

    assert_exactly_once_in_key_order(&effects.applied(), &events);
    assert!(
        proxy.injected() >= 3,
        "SQS faults injected: {}",
        proxy.injected()
    );
    assert!(
        first.broker.sqs_retries + second.broker.sqs_retries >= 1,
        "{first:?} {second:?}"
    );
    assert!(
        first.store_retries + second.store_retries >= 1,
        "{first:?} {second:?}"
    );
    // A commit that failed after committing is found a duplicate on retry,
    // so `applied` may count fewer than the effects the log holds.
    assert!(first.applied + second.applied <= 60, "{first:?} {second:?}");
}

/// A message that cannot be settled mid-batch (its dead letter cannot be
/// sent) cuts the batch: the rest is handed back unhandled, SQS delivers
/// the group again from that message, and the key's events reach the
/// handler in order, the rejected one dead-lettered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_mid_batch_hands_the_rest_back_in_group_order() {
    let setup = setup(true, true).await;
    let events = events_over_keys(10, 1);
    setup.publish_in_order(&events).await;
    let proxy = FaultProxy::start(&support::endpoint()).await;
    proxy.then_for("SendMessage", Reply::sqs_error(500, "InternalError"));
    let effects = Effects::default();
    effects.reject.lock().unwrap().insert(events[3].event_id);
    let (token, handle) = spawn(
        SqsConsumer::new(
            &sdk_config(&proxy.url()),
            setup.config("billing"),
            MemoryInbox::new(),
            effects.clone(),
        )
        .unwrap(),
    );
    effects.wait_for(9).await;
    let report = stop(token, handle).await;
    let expected: Vec<NewEvent> = events
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3)
        .map(|(_, e)| e.clone())
        .collect();
    assert_exactly_once_in_key_order(&effects.applied(), &expected);
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert!(report.broker.handed_back >= 7, "{report:?}");
    assert_eq!(report.broker.sqs_retries, 1, "{report:?}");
    let dead = setup.dead_letters(1).await;
    assert_eq!(
        dead[0]["attributes"]["event_id"],
        events[3].event_id.to_string()
    );
}

/// A handler slower than the visibility timeout keeps its message: the
/// runner extends the visibility while it works, so a second consumer
/// polling the same queue never receives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_visibility_timeout_keeps_its_message() {
    let setup = setup(false, true).await;
    setup.publish_in_order(&[event("slow", 1)]).await;
    let mut config = setup.config("billing");
    config.visibility_timeout = Duration::from_secs(2);
    let inbox = MemoryInbox::new();
    let slow = Effects {
        slow: Some(Duration::from_secs(5)),
        ..Effects::default()
    };
    let (slow_token, slow_handle) = spawn(
        SqsConsumer::new(
            &setup.aws.config,
            config.clone(),
            inbox.clone(),
            slow.clone(),
        )
        .unwrap(),
    );
    // The slow consumer holds the message before the other one starts.
    within("the slow consumer's receive", async {
        while setup.aws.depth(&setup.queue_url).await != 1
            || visible(&setup.aws, &setup.queue_url).await != 0
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let other = Effects::default();
    let (other_token, other_handle) =
        spawn(SqsConsumer::new(&setup.aws.config, config, inbox, other.clone()).unwrap());
    slow.wait_for(1).await;
    let slow_report = stop(slow_token, slow_handle).await;
    let other_report = stop(other_token, other_handle).await;
    assert_eq!(other_report.broker.received, 0, "{other_report:?}");
    assert_eq!(slow_report.applied, 1, "{slow_report:?}");
    assert!(
        slow_report.broker.visibility_extensions >= 2,
        "{slow_report:?}"
    );
}

async fn visible(aws: &Aws, queue_url: &str) -> usize {
    use aws_sdk_sqs::types::QueueAttributeName;
    aws.sqs
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()[&QueueAttributeName::ApproximateNumberOfMessages]
        .parse()
        .unwrap()
}

/// A queue that does not exist ends the consumer at start with the error,
/// rather than a consumer that logs warnings forever.
#[tokio::test]
async fn a_missing_queue_stops_the_consumer_at_start() {
    let aws = Aws::connect().await;
    let dlq = aws.create_queue(&unique("dlq")).await;
    let missing = dlq.replace("dlq-", "missing-");
    let config = ConsumerConfig::new(missing, "billing", dlq);
    let consumer =
        SqsConsumer::new(&aws.config, config, MemoryInbox::new(), Effects::default()).unwrap();
    let result = within("the consumer's end", consumer.run(CancellationToken::new())).await;
    match result {
        Err(ConsumerError::Sqs(message)) => {
            assert!(message.contains("missing-"), "{message}")
        }
        other => panic!("expected a queue error, got {other:?}"),
    }
}

#[test]
fn settings_that_cannot_work_are_refused() {
    let base = || ConsumerConfig::new("https://q/1", "c", "https://q/dlq");
    let cases: Vec<(&str, ConsumerConfig)> = vec![
        (
            "batch",
            ConsumerConfig {
                batch_size: 11,
                ..base()
            },
        ),
        (
            "wait",
            ConsumerConfig {
                wait_time: Duration::from_secs(21),
                ..base()
            },
        ),
        (
            "visibility",
            ConsumerConfig {
                visibility_timeout: Duration::from_secs(1),
                ..base()
            },
        ),
        (
            "receives",
            ConsumerConfig {
                max_receives: 0,
                ..base()
            },
        ),
        (
            "dlq",
            ConsumerConfig::new("https://q/1", "c", "https://q/1"),
        ),
        (
            "consumer",
            ConsumerConfig::new("https://q/1", "", "https://q/dlq"),
        ),
    ];
    assert!(base().validate().is_ok());
    for (label, config) in cases {
        assert!(
            matches!(config.validate(), Err(ConsumerError::Config(_))),
            "{label}"
        );
    }
}
