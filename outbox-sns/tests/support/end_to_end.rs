//! The end-to-end harness: a PostgreSQL outbox and inbox, a topic with a
//! queue subscribed, relays and a consumer over them.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::testing::RelayFleet;
use outbox_core::{CancellationToken, Publisher};
use outbox_sns::{ConsumerConfig, ConsumerReport, SnsPublisher, SqsConsumer, TopicRouter};
use outbox_sqlx::postgres::{EndToEndDb, RecordEffect};

use super::{Aws, Subscribed, unique};

/// The emulator is slow (4 relays × 400 events take over a minute on two
/// cores under a full parallel run); every wait ends as soon as its
/// condition holds.
pub const DEADLINE: Duration = Duration::from_secs(180);

pub async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

pub struct Setup {
    pub db: EndToEndDb,
    pub aws: Aws,
    pub subscribed: Subscribed,
    pub dead_letter_url: String,
}

/// The store, its clock and the effects log are the database's.
impl std::ops::Deref for Setup {
    type Target = EndToEndDb;
    fn deref(&self) -> &EndToEndDb {
        &self.db
    }
}

/// A PostgreSQL outbox and inbox in a schema of their own, and a topic with
/// a queue subscribed (FIFO when `fifo`; raw or enveloped).
pub async fn setup(fifo: bool, raw: bool) -> Setup {
    setup_in(EndToEndDb::create("sns").await, fifo, raw).await
}

/// The same on a manual clock, so a test can expire a dead relay's lease.
pub async fn setup_on_manual_clock(fifo: bool, raw: bool) -> Setup {
    setup_in(EndToEndDb::create_on_manual_clock("sns").await, fifo, raw).await
}

pub async fn setup_in(db: EndToEndDb, fifo: bool, raw: bool) -> Setup {
    let aws = Aws::connect().await;
    let subscribed = aws.topic_with_queue("e2e", fifo, raw).await;
    let suffix = if fifo { ".fifo" } else { "" };
    let dead_letter_url = aws
        .create_queue(&format!("{}{suffix}", unique("e2e-dlq")))
        .await;
    Setup {
        db,
        aws,
        subscribed,
        dead_letter_url,
    }
}

impl Setup {
    pub fn publisher(&self) -> SnsPublisher {
        SnsPublisher::new(
            &self.aws.config,
            TopicRouter::to(&self.subscribed.topic_arn),
        )
    }

    pub fn relays(&self, publisher: Arc<impl Publisher + 'static>, n: usize) -> RelayFleet {
        RelayFleet::spawn(self.store.clone(), publisher, "sns-relay", n)
    }

    pub fn consumer(&self) -> SqsConsumer<outbox_sqlx::postgres::PgInbox, RecordEffect> {
        let mut config =
            ConsumerConfig::new(&self.subscribed.queue_url, "billing", &self.dead_letter_url);
        config.wait_time = Duration::from_secs(1);
        SqsConsumer::new(
            &self.aws.config,
            config,
            self.store.inbox(),
            RecordEffect {
                log: self.log.clone(),
            },
        )
        .unwrap()
    }
}

pub async fn run_consumer_until(setup: &Setup, effects: usize) -> ConsumerReport {
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(setup.consumer().run(stop.clone()));
    setup.wait_for_effects(effects, DEADLINE).await;
    stop.cancel();
    within("consumer shutdown", consumer)
        .await
        .unwrap()
        .unwrap()
}
