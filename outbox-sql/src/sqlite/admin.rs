//! What SQLite's admin does its own way (the rest is `admin_traits.rs`):
//! operator actions update and read back in one statement (`RETURNING`),
//! and a replacement keeps its original's place in the key's order.

use std::time::Duration;

use outbox_core::store::{AttemptKind, EnqueueOutcome, OperatorAction};
use outbox_core::{EventId, NewEvent, StoreError};

use super::{Driver, Exec, Protocol};
use crate::admin_common::explain_miss;
use crate::history::superseded_detail;
use crate::param::{limit, micros};
use crate::validate::{check_event, headers_json};

impl<D: Driver> Protocol<D> {
    /// Runs an operator's `query` on a failed event, sets back the rows
    /// parked behind it, and records it in the event's history.
    pub(crate) async fn operator_update(
        &self,
        query: &str,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
    ) -> Result<(), StoreError> {
        let mut tx = self.driver.begin().await?;
        let now = self.now(&mut tx).await?;
        let rows = tx.fetch(query, vec![event_id.into(), now.into()]).await?;
        let Some(row) = rows.first() else {
            drop(tx);
            return Err(explain_miss(self, event_id).await);
        };
        let attempts = row.int("attempts")?;
        self.unpark_key(&mut tx, &row.text("partition_key")?)
            .await?;
        self.record_operator(&mut tx, event_id, kind, None, action, attempts)
            .await?;
        D::commit(tx).await
    }

    /// Enqueues the replacement in its original's place, marks the
    /// original superseded (it blocks no more) and sets back the rows
    /// parked behind it.
    pub(crate) async fn supersede_now(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        check_event(&replacement, &self.config.limits, false)?;
        let mut tx = self.driver.begin().await?;
        let now = self.now(&mut tx).await?;
        let old = tx
            .fetch(&self.queries.supersede_lock, vec![event_id.into()])
            .await?;
        let Some(old) = old.first() else {
            drop(tx);
            return Err(explain_miss(self, event_id).await);
        };
        let attempts = old.int("attempts")?;
        let available = self
            .config
            .delay_ms(replacement.available_at)
            .map(|ms| now.saturating_add(ms.saturating_mul(1000)));
        let insert = vec![
            old.int("ord_key")?.into(),
            replacement.event_id.to_string().into(),
            replacement.aggregate_type.as_str().into(),
            replacement.aggregate_id.as_str().into(),
            replacement.event_type.as_str().into(),
            replacement.partition_key.as_str().into(),
            replacement.payload.as_str().into(),
            i64::from(replacement.payload_version).into(),
            headers_json(&replacement).into(),
            now.into(),
            available.into(),
        ];
        let inserted = tx.fetch(&self.queries.supersede_insert, insert).await?;
        let Some(inserted) = inserted.first() else {
            return Ok(EnqueueOutcome::AlreadyExists);
        };
        let mark = vec![event_id.into(), replacement.event_id.into()];
        tx.execute(&self.queries.supersede_mark, mark).await?;
        self.unpark_key(&mut tx, &old.text("partition_key")?)
            .await?;
        let detail = superseded_detail(&replacement, action);
        let kind = AttemptKind::Superseded;
        self.record_operator(&mut tx, event_id, kind, Some(&detail), action, attempts)
            .await?;
        let sequence = inserted.int("sequence")?;
        D::commit(tx).await?;
        Ok(EnqueueOutcome::Inserted { sequence })
    }

    /// Deletes up to `most` published events older than `age`, and their history.
    pub(crate) async fn purge_now(&self, age: Duration, most: usize) -> Result<u64, StoreError> {
        let mut tx = self.driver.begin().await?;
        let cutoff = self.now(&mut tx).await?.saturating_sub(micros(age));
        let params = || vec![cutoff.into(), limit(most)];
        tx.execute(&self.queries.purge_history, params()).await?;
        let done = tx.execute(&self.queries.purge, params()).await?;
        D::commit(tx).await?;
        Ok(done)
    }
}
