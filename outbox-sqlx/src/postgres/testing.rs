//! Hooks for the core's conformance suites (feature `testing`).

use async_trait::async_trait;
use outbox_core::testing::{BeginWrite, OpenWrite};
use outbox_core::{NewEvent, StoreError};
use sqlx::{Postgres, Transaction};

use super::store::PgStore;
use crate::error::ResultExt;

struct PgOpenWrite {
    store: PgStore,
    tx: Transaction<'static, Postgres>,
}

#[async_trait]
impl OpenWrite for PgOpenWrite {
    async fn enqueue(&mut self, event: NewEvent) -> Result<(), StoreError> {
        self.store.enqueue(&mut self.tx, &[event]).await.map(drop)
    }
    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        self.tx.commit().await.store()
    }
}

#[async_trait]
impl BeginWrite for PgStore {
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError> {
        let tx = self.pool.begin().await.store()?;
        Ok(Box::new(PgOpenWrite {
            store: self.clone(),
            tx,
        }))
    }
}
