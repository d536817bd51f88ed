//! [`MemoryInbox`]: the reference implementation of [`InboxStore`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::clock::{Clock, SystemClock, elapsed_between};
use crate::error::StoreError;
use crate::event::EventId;
use crate::inbox::InboxStore;

type Effect = Box<dyn FnOnce() + Send>;
/// `(consumer, event_id)` → when the claim committed.
type Claims = HashMap<(String, EventId), DateTime<Utc>>;

/// An inbox in memory. Clones share the same claims.
#[derive(Clone, Debug)]
pub struct MemoryInbox {
    claims: Arc<Mutex<Claims>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryInbox {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryInbox {
    /// An inbox on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An inbox on `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            claims: Arc::default(),
            clock,
        }
    }

    /// Number of committed claims.
    pub fn len(&self) -> usize {
        self.claims.lock().expect("inbox lock").len()
    }

    /// True when nothing was claimed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A transaction on a [`MemoryInbox`]: claims plus effects that run only if
/// it commits, standing in for the consumer's database writes.
#[derive(Default)]
pub struct MemoryInboxTx {
    claims: Vec<(String, EventId)>,
    effects: Vec<Effect>,
}

impl std::fmt::Debug for MemoryInboxTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryInboxTx")
            .field("claims", &self.claims)
            .field("effects", &self.effects.len())
            .finish()
    }
}

impl MemoryInboxTx {
    /// Registers an effect that happens if, and only if, the transaction commits.
    pub fn on_commit(&mut self, effect: impl FnOnce() + Send + 'static) {
        self.effects.push(Box::new(effect));
    }
}

#[async_trait]
impl InboxStore for MemoryInbox {
    type Transaction = MemoryInboxTx;

    async fn begin(&self) -> Result<MemoryInboxTx, StoreError> {
        Ok(MemoryInboxTx::default())
    }

    async fn claim(
        &self,
        tx: &mut MemoryInboxTx,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        let key = (consumer.to_owned(), event_id);
        if tx.claims.contains(&key) || self.claims.lock().expect("inbox lock").contains_key(&key) {
            return Ok(false);
        }
        tx.claims.push(key);
        Ok(true)
    }

    async fn commit(&self, tx: MemoryInboxTx) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut claims = self.claims.lock().expect("inbox lock");
        // A concurrent transaction that committed the same claim first wins,
        // as the unique key does in SQL; this one fails and applies nothing.
        if let Some((consumer, id)) = tx.claims.iter().find(|k| claims.contains_key(*k)) {
            return Err(StoreError::Conflict(format!(
                "inbox claim ({consumer}, {id}) committed concurrently"
            )));
        }
        for key in tx.claims {
            claims.insert(key, now);
        }
        for effect in tx.effects {
            effect();
        }
        Ok(())
    }

    async fn rollback(&self, _tx: MemoryInboxTx) -> Result<(), StoreError> {
        Ok(())
    }

    async fn purge_older_than(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let mut claims = self.claims.lock().expect("inbox lock");
        let doomed: Vec<_> = claims
            .iter()
            .filter(|(_, at)| elapsed_between(now, **at) >= older_than)
            .take(batch_size)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &doomed {
            claims.remove(key);
        }
        Ok(doomed.len() as u64)
    }
}
