//! Settling a received batch with SQS: deleting what was handled and
//! handing back what was not, each batch request retried a few times.
//!
//! Both are best effort — a message not deleted comes back after its
//! visibility timeout and the inbox absorbs it; a message not handed back
//! comes back after its visibility timeout too — but the retries matter for
//! a FIFO group: until its unhandled messages are visible again, the group
//! is held, and relying on the timeout with several of a group's messages
//! in flight is where emulators (moto releases such a group from its *last*
//! message) and slow consumers hurt most.

use std::time::Duration;

use aws_sdk_sqs::types::{
    BatchResultErrorEntry, ChangeMessageVisibilityBatchRequestEntry,
    DeleteMessageBatchRequestEntry, Message,
};

use crate::error::describe;

/// Attempts per batch request, the first included.
const ATTEMPTS: u32 = 3;
/// Pause before the second attempt; doubled before each later one.
const FIRST_PAUSE: Duration = Duration::from_millis(50);

/// One batch request of `$op` with an `$entry` per pending message (its
/// position as the id, its receipt handle), answering what SQS refused.
macro_rules! batch_request {
    ($client:expr, $queue_url:expr, $pending:expr, $op:ident, $entry:ty $(, $set:ident($value:expr))*) => {{
        let entries = $pending
            .iter()
            .filter_map(|(id, m)| {
                <$entry>::builder()
                    .id(id.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    $(.$set($value))*
                    .build()
                    .ok()
            })
            .collect();
        let output = $client
            .$op()
            .queue_url($queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| describe(&e))?;
        Ok(refused(output.failed()))
    }};
}

/// Deletes `settled`; returns how many could not be deleted.
pub(crate) async fn delete(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
    settled: &[&Message],
) -> usize {
    let unsettled = "settled messages not deleted; they will be redelivered and absorbed";
    in_chunks(settled, unsettled, |pending| async move {
        batch_request!(
            client,
            queue_url,
            pending,
            delete_message_batch,
            DeleteMessageBatchRequestEntry
        )
    })
    .await
}

/// Makes `rest` visible again at once; returns how many stay invisible
/// until their visibility timeout.
pub(crate) async fn hand_back(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
    rest: &[Message],
) -> usize {
    let rest: Vec<&Message> = rest.iter().collect();
    let held = "messages not handed back; they reappear after the visibility timeout";
    in_chunks(&rest, held, |pending| async move {
        batch_request!(
            client,
            queue_url,
            pending,
            change_message_visibility_batch,
            ChangeMessageVisibilityBatchRequestEntry,
            visibility_timeout(0)
        )
    })
    .await
}

/// `messages` in batch requests of ten (SQS's limit), each sent by `send`
/// [`with_retries`]; returns how many were never accepted, and warns with
/// `warning` when any were not.
async fn in_chunks<'m, F, Fut>(messages: &[&'m Message], warning: &str, send: F) -> usize
where
    F: Fn(Vec<(usize, &'m Message)>) -> Fut,
    Fut: Future<Output = Result<Vec<Refused>, String>>,
{
    let mut left = 0;
    for chunk in messages.chunks(10) {
        left += with_retries(chunk, &send).await;
    }
    if left > 0 {
        tracing::warn!(failed = left, "{warning}");
    }
    left
}

/// The entries a batch answer refused.
fn refused(failed: &[BatchResultErrorEntry]) -> Vec<Refused> {
    failed
        .iter()
        .map(|f| (f.id().to_owned(), f.sender_fault(), f.code().to_owned()))
        .collect()
}

/// An entry SQS refused: its id, whether the request was at fault, the code.
type Refused = (String, bool, String);

/// Sends `chunk` (ids are positions) with `send`, then again with the
/// entries that failed for a reason worth retrying, up to [`ATTEMPTS`];
/// returns how many were never accepted.
async fn with_retries<'m, F, Fut>(chunk: &[&'m Message], send: &F) -> usize
where
    F: Fn(Vec<(usize, &'m Message)>) -> Fut,
    Fut: Future<Output = Result<Vec<Refused>, String>>,
{
    let mut pending: Vec<(usize, &Message)> = chunk.iter().copied().enumerate().collect();
    let mut pause = FIRST_PAUSE;
    let mut given_up = 0;
    for attempt in 1..=ATTEMPTS {
        match send(pending.clone()).await {
            Ok(refused) => {
                // A receipt SQS no longer knows (the message was deleted or
                // its receipt expired) will not be accepted on a retry.
                let retry: Vec<usize> = refused
                    .iter()
                    .filter(|(_, sender_fault, code)| {
                        !sender_fault && code != "ReceiptHandleIsInvalid"
                    })
                    .filter_map(|(id, _, _)| id.parse().ok())
                    .collect();
                given_up += refused.len() - retry.len();
                pending.retain(|(id, _)| retry.contains(id));
                if pending.is_empty() {
                    return given_up;
                }
                if attempt == ATTEMPTS {
                    return given_up + pending.len();
                }
                tracing::debug!(?refused, attempt, "retrying refused entries");
            }
            Err(error) if attempt == ATTEMPTS => {
                tracing::debug!(%error, attempt, "batch request failed");
                return given_up + pending.len();
            }
            Err(error) => tracing::debug!(%error, attempt, "batch request failed; retrying"),
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
    given_up + pending.len()
}
