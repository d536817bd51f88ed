//! Cutting a future off at each of its await points in turn, as an aborted
//! task, a `select!` or a timeout would, without timing anything.

use std::future::Future;
use std::task::Poll;

use super::fixtures::event;
use super::store_suite::request;
use crate::store::{OutboxStore, OutboxWriter};

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

/// What [`cut_store_operations`] cut: how many times each operation was
/// cut before a run of it completed, over all sweeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cuts {
    /// `claim_batch`.
    pub claim: usize,
    /// `ack` of a claimed batch.
    pub ack: usize,
    /// `enqueue` in the store's own transaction.
    pub enqueue: usize,
}

/// A store's relay and producer operations (`claim_batch`, `ack`,
/// `enqueue`) cut off at each of their await points in turn, `sweeps`
/// times over (whether a read waits depends on when the answer arrives, so
/// each sweep cuts at slightly different points). After each cut,
/// `check(operation, cut)` asserts what must hold: typically that the
/// store's one pooled connection came back outside any transaction.
/// Enqueues a backlog first, one key per event, so claims cut after they
/// leased still leave work for the next.
///
/// Panics if a claim finds nothing to ack or an operation never completes.
pub async fn cut_store_operations<S, Check, CheckFut>(
    store: &S,
    sweeps: usize,
    mut check: Check,
) -> Cuts
where
    S: OutboxStore + OutboxWriter + ?Sized,
    Check: FnMut(&'static str, usize) -> CheckFut,
    CheckFut: Future<Output = ()>,
{
    let backlog: Vec<_> = (0..3_000).map(|n| event(&format!("k{n}"), n)).collect();
    store.enqueue(&backlog).await.expect("the backlog");
    let request = request("cut", 3);
    let mut cuts = Cuts::default();
    let mut fresh = 10_000;
    for _ in 0..sweeps {
        cuts.claim += cancel_at_every_await(
            || store.claim_batch(&request),
            |cut| check("claim_batch", cut),
        )
        .await;
        let claimed = store.claim_batch(&request).await.expect("a claim").events;
        let leases: Vec<_> = claimed.into_iter().map(|c| c.lease).collect();
        assert!(!leases.is_empty(), "a backlog left to ack");
        cuts.ack += cancel_at_every_await(|| store.ack(&leases), |cut| check("ack", cut)).await;
        cuts.enqueue += cancel_at_every_await(
            || {
                fresh += 1;
                let events = vec![event("fresh", fresh)];
                async move { store.enqueue(&events).await }
            },
            |cut| check("enqueue", cut),
        )
        .await;
    }
    assert!(
        cuts.claim > 0 && cuts.ack > 0 && cuts.enqueue > 0,
        "every operation was cut before a run completed: {cuts:?}"
    );
    cuts
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
