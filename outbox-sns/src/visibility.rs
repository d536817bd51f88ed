//! Keeps received messages invisible while the runner still holds them.
//!
//! A batch is held from receive until its messages are deleted (after their
//! effects committed) or handed back. A handler that runs longer than the
//! queue's visibility timeout would otherwise let SQS deliver the message to
//! another consumer mid-flight — and, on a FIFO queue, unblock its group's
//! later messages behind its back.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry;
use tokio::task::JoinHandle;

/// Extends the visibility of held messages every half timeout until dropped.
pub(crate) struct VisibilityKeeper {
    held: Arc<Mutex<Vec<String>>>,
    extensions: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl VisibilityKeeper {
    /// Starts extending `receipts` to `timeout` every `timeout / 2`.
    pub(crate) fn start(
        client: aws_sdk_sqs::Client,
        queue_url: String,
        timeout: Duration,
        receipts: Vec<String>,
    ) -> Self {
        let held = Arc::new(Mutex::new(receipts));
        let extensions = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(keep(
            client,
            queue_url,
            timeout,
            held.clone(),
            extensions.clone(),
        ));
        Self {
            held,
            extensions,
            task,
        }
    }

    /// Stops extending `receipt` (deleted or handed back).
    pub(crate) fn release(&self, receipt: &str) {
        self.held
            .lock()
            .expect("visibility keeper lock")
            .retain(|r| r != receipt);
    }

    /// Extension requests that succeeded so far.
    pub(crate) fn extensions(&self) -> u64 {
        self.extensions.load(Ordering::Relaxed)
    }
}

impl Drop for VisibilityKeeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn keep(
    client: aws_sdk_sqs::Client,
    queue_url: String,
    timeout: Duration,
    held: Arc<Mutex<Vec<String>>>,
    extensions: Arc<AtomicU64>,
) {
    let seconds = timeout.as_secs().clamp(1, 43_200) as i32;
    let every = (timeout / 2).max(Duration::from_millis(500));
    loop {
        tokio::time::sleep(every).await;
        let receipts = held.lock().expect("visibility keeper lock").clone();
        for chunk in receipts.chunks(10) {
            let entries: Vec<ChangeMessageVisibilityBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, receipt)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(receipt)
                        .visibility_timeout(seconds)
                        .build()
                        .ok()
                })
                .collect();
            let changed = client
                .change_message_visibility_batch()
                .queue_url(&queue_url)
                .set_entries(Some(entries))
                .send()
                .await;
            match changed {
                Ok(output) if output.failed().is_empty() => {
                    extensions.fetch_add(1, Ordering::Relaxed);
                }
                Ok(output) => {
                    tracing::warn!(failed = ?output.failed(), "could not extend the visibility of some held messages");
                }
                Err(error) => {
                    tracing::warn!(%error, "could not extend the visibility of held messages");
                }
            }
        }
    }
}
