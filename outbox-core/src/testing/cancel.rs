//! Cutting a future off at each of its await points in turn, as an aborted
//! task, a `select!` or a timeout would, without timing anything.

use std::future::Future;
use std::task::Poll;

/// Most await points [`cancel_at_every_await`] cuts before it gives up.
const MAX_CUTS: usize = 1_000;

/// Polls `future` until it has answered `Pending` `cuts` times, then drops
/// it right there, in the middle of what it was waiting for. `Some` with
/// its output if it finished first.
pub async fn cancel_after_pending<F: Future>(future: F, cuts: usize) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut pending = 0;
    std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending if pending == cuts => Poll::Ready(None),
        Poll::Pending => {
            pending += 1;
            Poll::Pending
        }
    })
    .await
}

/// Runs `operation()` again and again, cut off after its first, second,
/// third … `Pending`, and after each cut awaits `check(cut)` (which asserts
/// what must hold after a cancellation), until a run completes: every
/// await point has then been cut once. Returns how many were.
///
/// Panics if the operation never completes within 1,000 cuts.
pub async fn cancel_at_every_await<Op, Fut, Check, CheckFut>(
    mut operation: Op,
    mut check: Check,
) -> usize
where
    Op: FnMut() -> Fut,
    Fut: Future,
    Check: FnMut(usize) -> CheckFut,
    CheckFut: Future<Output = ()>,
{
    for cut in 0..MAX_CUTS {
        if cancel_after_pending(operation(), cut).await.is_some() {
            return cut;
        }
        check(cut).await;
    }
    panic!("the operation never completed within {MAX_CUTS} cuts");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Three awaits that really wait, recording how far each run got.
    async fn three_steps(reached: Arc<AtomicUsize>) -> &'static str {
        for step in 1..=3 {
            tokio::task::yield_now().await;
            reached.store(step, Ordering::SeqCst);
        }
        "done"
    }

    #[tokio::test]
    async fn each_await_point_is_cut_once_then_the_run_completes() {
        let reached = Arc::new(AtomicUsize::new(0));
        let mut seen = Vec::new();
        let cuts = cancel_at_every_await(
            || {
                reached.store(0, Ordering::SeqCst);
                three_steps(reached.clone())
            },
            |cut| {
                seen.push((cut, reached.load(Ordering::SeqCst)));
                std::future::ready(())
            },
        )
        .await;
        assert_eq!(cuts, 3);
        assert_eq!(seen, vec![(0, 0), (1, 1), (2, 2)]);
    }

    #[tokio::test]
    async fn a_future_that_is_ready_is_never_cut() {
        assert_eq!(cancel_after_pending(async { 7 }, 0).await, Some(7));
    }
}
