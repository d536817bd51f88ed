//! A consumer's downstream that is broken until a test fixes it: for the
//! dead-letter and replay tests of every broker adapter.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::consume::{Handler, HandlerError};

/// A [`Handler`] of any event over any transaction: while broken it fails
/// every event (rejecting it, or asking for a retry), then it counts each
/// event it applies. Clones share their state.
#[derive(Clone, Debug)]
pub struct Downstream {
    broken: Arc<AtomicBool>,
    applied: Arc<AtomicU32>,
    reject: bool,
    reason: String,
}

impl Downstream {
    /// Broken: rejects every event with `reason` (the runner gives up at
    /// once and dead-letters it).
    pub fn rejecting(reason: &str) -> Self {
        Self::broken(true, reason)
    }

    /// Broken: fails every event with a retryable `reason` (retried in
    /// place, then given up).
    pub fn retrying(reason: &str) -> Self {
        Self::broken(false, reason)
    }

    fn broken(reject: bool, reason: &str) -> Self {
        Self {
            broken: Arc::new(AtomicBool::new(true)),
            applied: Arc::default(),
            reject,
            reason: reason.to_owned(),
        }
    }

    /// The downstream works from now on.
    pub fn fix(&self) {
        self.broken.store(false, Ordering::SeqCst);
    }

    /// Events applied since it was fixed.
    pub fn applied(&self) -> u32 {
        self.applied.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl<Tx: Send, E: Sync> Handler<Tx, E> for Downstream {
    async fn handle(&self, _tx: &mut Tx, _event: &E) -> Result<(), HandlerError> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(if self.reject {
                HandlerError::Reject(self.reason.clone())
            } else {
                HandlerError::Retry(self.reason.clone())
            });
        }
        self.applied.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}
