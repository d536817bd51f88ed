//! A connection of the pool kept for one kind of relay statement.
//!
//! The claim and settlement functions are planned once per connection; a
//! pool hands out its idle connections in turn, so every one of them would
//! plan them again (tens of milliseconds for the claim). A relay's claims
//! run one at a time per table anyway, so one connection kept for them (and
//! one for settlements, which run beside the next claim) keeps the plans
//! warm.
//!
//! The connections are taken from the pool (its connect options and
//! `after_connect` apply) and then detached: closing the pool must not wait
//! for a store that is merely idle, so they count beside the pool's
//! `max_connections`, not in it, and are dropped once the pool is closed.

use std::sync::Arc;

use outbox_core::StoreError;
use sqlx::{PgConnection, PgPool};
use tokio::sync::{Mutex, MutexGuard};

use crate::error::ResultExt;

#[derive(Clone, Default)]
pub(super) struct KeptConnection(Arc<Mutex<Option<PgConnection>>>);

impl KeptConnection {
    /// The kept connection, taken from `pool` first if there is none.
    pub(super) async fn lock(&self, pool: &PgPool) -> Result<Kept<'_>, StoreError> {
        let mut slot = self.0.lock().await;
        if pool.is_closed() {
            *slot = None;
        }
        if slot.is_none() {
            *slot = Some(pool.acquire().await.store()?.detach());
        }
        Ok(Kept(slot))
    }
}

pub(super) struct Kept<'a>(MutexGuard<'a, Option<PgConnection>>);

impl Kept<'_> {
    pub(super) fn conn(&mut self) -> &mut PgConnection {
        self.0.as_mut().expect("a kept connection")
    }

    /// Drops the connection after an error: the next call takes a fresh
    /// one (the old one may be broken).
    pub(super) fn discard(mut self) {
        *self.0 = None;
    }
}
