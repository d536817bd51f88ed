//! [`MockPublisher`]: a publisher a test drives one call at a time.

use async_trait::async_trait;
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::event::StoredEvent;
use crate::publisher::{PublishError, PublishOutcome, Publisher, PublisherCapabilities};

/// One `publish` call waiting for the test's answer.
#[derive(Debug)]
pub struct PendingPublish {
    /// The events of the call.
    pub events: Vec<StoredEvent>,
    respond: oneshot::Sender<Vec<PublishOutcome>>,
}

impl PendingPublish {
    /// Answers with one outcome per event.
    pub fn respond(self, outcomes: Vec<PublishOutcome>) {
        let _ = self.respond.send(outcomes);
    }

    /// Every event succeeds.
    pub fn succeed_all(self) {
        let n = self.events.len();
        self.respond((0..n).map(|_| Ok(())).collect());
    }

    /// Every event fails with a copy of `error`'s class and message.
    pub fn fail_all(self, error: PublishError) {
        let n = self.events.len();
        self.respond(
            (0..n)
                .map(|_| Err(PublishError::new(error.class, error.message.clone())))
                .collect(),
        );
    }

    /// Never answers: the call hangs until the relay's publish timeout.
    pub fn hang(self) {
        std::mem::forget(self.respond);
    }
}

/// The test's end of a [`MockPublisher`].
#[derive(Debug)]
pub struct MockHandle(Mutex<mpsc::UnboundedReceiver<PendingPublish>>);

impl MockHandle {
    /// The next `publish` call, in the order the relay made them.
    pub async fn next_call(&self) -> PendingPublish {
        self.0
            .lock()
            .await
            .recv()
            .await
            .expect("mock publisher dropped")
    }
}

/// A publisher whose every call waits for the test to answer it through the
/// [`MockHandle`] (in the manner of `tower_test::mock::pair`).
#[derive(Debug, Clone)]
pub struct MockPublisher {
    calls: mpsc::UnboundedSender<PendingPublish>,
    capabilities: PublisherCapabilities,
}

impl MockPublisher {
    /// A connected publisher and handle.
    pub fn pair() -> (Self, MockHandle) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Self {
                calls: tx,
                capabilities: PublisherCapabilities::default(),
            },
            MockHandle(Mutex::new(rx)),
        )
    }

    /// Overrides the declared capabilities.
    pub fn with_capabilities(mut self, capabilities: PublisherCapabilities) -> Self {
        self.capabilities = capabilities;
        self
    }
}

#[async_trait]
impl Publisher for MockPublisher {
    fn capabilities(&self) -> PublisherCapabilities {
        self.capabilities
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let (respond, answer) = oneshot::channel();
        let call = PendingPublish {
            events: batch.iter().map(|e| (*e).clone()).collect(),
            respond,
        };
        if self.calls.send(call).is_err() {
            return batch
                .iter()
                .map(|_| Err(PublishError::outage("mock handle dropped")))
                .collect();
        }
        match answer.await {
            Ok(outcomes) => outcomes,
            // The test forgot the call: behave like a hung broker.
            Err(_) => std::future::pending().await,
        }
    }
}
