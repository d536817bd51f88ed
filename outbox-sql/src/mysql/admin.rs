//! What MySQL/MariaDB's admin does its own way (the rest is
//! `admin_traits.rs`): operator actions lock the failed row first, and
//! purge deletes by primary key lists.

use std::time::Duration;

use outbox_core::store::{AttemptKind, EnqueueOutcome, OperatorAction};
use outbox_core::{EventId, NewEvent, StoreError};

use super::driver::{Driver, Exec, Param};
use super::protocol::Protocol;
use super::with_in_list;
use crate::admin_common::explain_miss;
use crate::history::superseded_detail;
use crate::param::{limit, micros};

impl<D: Driver> Protocol<D> {
    /// Locks a failed, not superseded event; its attempts and key, `None`
    /// if there is none.
    async fn lock_failed(
        &self,
        tx: &mut D::Tx,
        event_id: EventId,
    ) -> Result<Option<(i64, String)>, StoreError> {
        let rows = tx
            .fetch(&self.queries.select_failed, vec![event_id.into()])
            .await?;
        rows.first()
            .map(|r| Ok((r.int("attempts")?, r.text("partition_key")?)))
            .transpose()
    }

    /// Runs an operator's `query` (a requeue binds store time first) on a
    /// failed event, sets back the rows parked behind it, and records it in
    /// the event's history.
    pub(crate) async fn operator_update(
        &self,
        query: &str,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
    ) -> Result<(), StoreError> {
        let mut tx = self.driver.begin(false).await?;
        let Some((attempts, key)) = self.lock_failed(&mut tx, event_id).await? else {
            drop(tx);
            return Err(explain_miss(self, event_id).await);
        };
        let requeue = kind == AttemptKind::Requeued;
        let mut bound = Vec::new();
        if requeue {
            bound.push(self.now(&mut tx).await?.into());
        }
        bound.push(event_id.into());
        tx.execute(query, bound).await?;
        self.unpark_key(&mut tx, &key).await?;
        let attempts = if requeue { 0 } else { attempts };
        self.record_operator(&mut tx, event_id, kind, None, action, attempts)
            .await?;
        D::commit(tx).await
    }

    /// The replacement is enqueued at the end of its key; a blocking
    /// original keeps blocking everything of the key but its replacement
    /// until the replacement is published, so it still goes first.
    pub(crate) async fn supersede_now(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        let mut tx = self.driver.begin(false).await?;
        let Some((attempts, _)) = self.lock_failed(&mut tx, event_id).await? else {
            drop(tx);
            return Err(explain_miss(self, event_id).await);
        };
        let outcome = self
            .enqueue(&mut tx, std::slice::from_ref(&replacement))
            .await?[0];
        if outcome == EnqueueOutcome::AlreadyExists {
            return Ok(outcome);
        }
        let mark = vec![replacement.event_id.into(), event_id.into()];
        tx.execute(&self.queries.supersede_mark, mark).await?;
        let detail = superseded_detail(&replacement, action);
        let kind = AttemptKind::Superseded;
        self.record_operator(&mut tx, event_id, kind, Some(&detail), action, attempts)
            .await?;
        D::commit(tx).await?;
        Ok(outcome)
    }

    /// Deletes up to `most` published events older than `age`, and their
    /// history, locked by primary key.
    pub(crate) async fn purge_now(&self, age: Duration, most: usize) -> Result<u64, StoreError> {
        let mut tx = self.begin_relay().await?;
        let cutoff = self.now(&mut tx).await?.saturating_sub(micros(age));
        let doomed = tx
            .fetch(&self.queries.purge_select, vec![cutoff.into(), limit(most)])
            .await?;
        let mut sequences = Vec::with_capacity(doomed.len());
        let mut ids = Vec::with_capacity(doomed.len());
        for r in &doomed {
            sequences.push(Param::Int(r.int("sequence")?));
            ids.push(Param::Text(r.text("event_id")?));
        }
        let purged = sequences.len() as u64;
        if !sequences.is_empty() {
            let history = with_in_list(&self.queries.purge_history, ids.len());
            tx.execute(&history, ids).await?;
            let purge = with_in_list(&self.queries.purge, sequences.len());
            tx.execute(&purge, sequences).await?;
        }
        D::commit(tx).await?;
        Ok(purged)
    }
}
