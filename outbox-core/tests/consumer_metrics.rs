//! Consumer runners report through the shared `consume::Applier`: one
//! delivery counted per outcome, handler retries, store retries and handler
//! time. Own test binary: the debugging recorder is installed process-wide.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use outbox_core::consume::{Applied, Applier, Handler, HandlerError, metrics as names};
use outbox_core::memory::{MemoryInbox, MemoryInboxTx};
use outbox_core::policy::FixedRandom;
use outbox_core::relay::OutagePolicy;
use outbox_core::testing::{Faulty, InboxFault};
use outbox_core::{CancellationToken, EventId, Headers, RetryPolicy, StoreError};

/// An inbox's fault: its first `n` `begin`s fail as a restarting database
/// would.
struct DownAtFirst {
    failures_left: AtomicU32,
}

impl InboxFault<MemoryInbox> for DownAtFirst {
    fn before(&self, operation: &str) -> Result<(), StoreError> {
        let left = self.failures_left.load(Ordering::SeqCst);
        if operation == "begin" && left > 0 {
            self.failures_left.store(left - 1, Ordering::SeqCst);
            return Err(StoreError::Unavailable("injected: restarting".into()));
        }
        Ok(())
    }
}

/// Fails the first call of each event with Retry; rejects event "poison".
struct FailsOnce {
    calls: AtomicU32,
}

#[async_trait::async_trait]
impl Handler<MemoryInboxTx, &'static str> for FailsOnce {
    async fn handle(
        &self,
        _tx: &mut MemoryInboxTx,
        event: &&'static str,
    ) -> Result<(), HandlerError> {
        if *event == "poison" {
            return Err(HandlerError::Reject("poison".into()));
        }
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(HandlerError::Retry("first call fails".into()));
        }
        Ok(())
    }
}

#[tokio::test]
async fn the_applier_counts_outcomes_retries_and_handler_time() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("first recorder in this process");

    // The inbox fails its first 2 transactions with a retryable error.
    let failures_left = AtomicU32::new(2);
    let inbox = Faulty::wrap(MemoryInbox::new(), DownAtFirst { failures_left });
    let handler = FailsOnce {
        calls: AtomicU32::new(0),
    };
    let retry = RetryPolicy::immediate(3);
    let outage = OutagePolicy {
        initial_pause: Duration::from_millis(1),
        max_pause: Duration::from_millis(2),
    };
    let shutdown = CancellationToken::new();
    let random = FixedRandom(0.5);
    let mut applier = Applier {
        inbox: &inbox,
        consumer: "billing",
        handler: &handler,
        handler_retry: &retry,
        store_outage: &outage,
        random: &random,
        shutdown: &shutdown,
        store_retries: 0,
    };
    let paid = EventId::random();
    assert_eq!(
        applier
            .apply(paid, &Headers::default(), &"paid")
            .await
            .unwrap(),
        Applied::Applied
    );
    assert_eq!(
        applier
            .apply(paid, &Headers::default(), &"paid")
            .await
            .unwrap(),
        Applied::Duplicate
    );
    assert!(matches!(
        applier
            .apply(EventId::random(), &Headers::default(), &"poison")
            .await
            .unwrap(),
        Applied::GaveUp(_)
    ));

    let mut counters: HashMap<(String, Vec<String>), u64> = HashMap::new();
    let mut handler_samples = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let labels: Vec<String> = key
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        match value {
            DebugValue::Counter(n) => {
                *counters
                    .entry((key.key().name().to_owned(), labels))
                    .or_insert(0) += n;
            }
            DebugValue::Histogram(samples) if key.key().name() == names::HANDLER_SECONDS => {
                handler_samples += samples.len();
            }
            _ => {}
        }
    }
    let count = |name: &str, labels: &[&str]| {
        counters
            .get(&(
                name.to_owned(),
                labels.iter().map(|l| l.to_string()).collect(),
            ))
            .copied()
            .unwrap_or(0)
    };
    for outcome in ["applied", "duplicate", "gave_up"] {
        assert_eq!(
            count(
                names::DELIVERIES,
                &["consumer=billing", &format!("outcome={outcome}")]
            ),
            1,
            "{outcome}: {counters:?}"
        );
    }
    assert_eq!(
        count(names::HANDLER_RETRIES, &["consumer=billing"]),
        1,
        "{counters:?}"
    );
    assert_eq!(
        count(names::STORE_RETRIES, &["consumer=billing"]),
        2,
        "{counters:?}"
    );
    // The first failing call, the retry that worked, and the rejection.
    assert_eq!(handler_samples, 3);
}
