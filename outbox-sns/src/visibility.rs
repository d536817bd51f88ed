//! Keeps received messages invisible while the runner still holds them.
//!
//! A batch is held from receive until its messages are deleted (after their
//! effects committed) or handed back. A handler that runs longer than the
//! queue's visibility timeout would otherwise let SQS deliver the message to
//! another consumer mid-flight — and, on a FIFO queue, unblock its group's
//! later messages behind its back.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_sdk_sqs::types::ChangeMessageVisibilityBatchRequestEntry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Extends the visibility of held messages every half timeout until stopped.
pub(crate) struct VisibilityKeeper {
    stop: CancellationToken,
    extensions: Arc<AtomicU64>,
    task: Option<JoinHandle<()>>,
}

impl VisibilityKeeper {
    /// Starts extending `receipts` to `timeout` every `timeout / 2`.
    pub(crate) fn start(
        client: aws_sdk_sqs::Client,
        queue_url: String,
        timeout: Duration,
        receipts: Vec<String>,
    ) -> Self {
        let stop = CancellationToken::new();
        let extensions = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(keep(
            client,
            queue_url,
            timeout,
            receipts,
            stop.clone(),
            extensions.clone(),
        ));
        Self {
            stop,
            extensions,
            task: Some(task),
        }
    }

    /// Stops extending and waits for an extension already sent to be
    /// answered, so none lands after the batch is settled; returns the
    /// extension requests that succeeded.
    pub(crate) async fn stop(mut self) -> u64 {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            // The task only ends by returning (it never panics on its
            // own); an abort from a runtime shutting down is no concern.
            let _ = task.await;
        }
        self.extensions.load(Ordering::Relaxed)
    }
}

impl Drop for VisibilityKeeper {
    /// A keeper dropped unstopped (its batch abandoned mid-way) stops at once.
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn keep(
    client: aws_sdk_sqs::Client,
    queue_url: String,
    timeout: Duration,
    receipts: Vec<String>,
    stop: CancellationToken,
    extensions: Arc<AtomicU64>,
) {
    let seconds = timeout.as_secs().clamp(1, 43_200) as i32;
    let every = (timeout / 2).max(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        for chunk in receipts.chunks(10) {
            // Checked between requests, never during one: a request cut
            // off mid-way may still be applied by SQS.
            if stop.is_cancelled() {
                return;
            }
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
