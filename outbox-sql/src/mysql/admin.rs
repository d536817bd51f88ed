//! [`OutboxAdmin`] on MySQL/MariaDB, once for every driver.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::store::{
    AttemptKind, AttemptRecord, BlockedKey, EnqueueOutcome, EventState, EventTypeStats,
    FailedEvent, HeldBack, OperatorAction, OutboxAdmin, RelayStatus,
};
use outbox_core::{EventId, NewEvent, StoreError};

use super::driver::{Driver, Exec, Param, Row, from_micros};
use super::protocol::{Protocol, during};
use super::statements::raw_event;
use super::with_in_list;
use crate::admin_common::{
    blocked_key, event_state, held_back, relay_status, superseded_by, type_stats,
};
use crate::history::HistoryEntry;

impl<D: Driver> Protocol<D> {
    /// Locks a failed, not superseded event; its attempts, `None` if there
    /// is none.
    async fn lock_failed(
        &self,
        tx: &mut D::Tx,
        event_id: EventId,
    ) -> Result<Option<i64>, StoreError> {
        let rows = tx
            .fetch(
                &self.queries.select_failed,
                vec![event_id.to_string().into()],
            )
            .await?;
        rows.first().map(|r| r.int("attempts")).transpose()
    }

    async fn operator_update(
        &self,
        query: &str,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
        with_now: bool,
    ) -> Result<(), StoreError> {
        self.sync_clock().await?;
        let mut tx = self.driver.begin(false).await?;
        let Some(attempts) = self.lock_failed(&mut tx, event_id).await? else {
            drop(tx);
            return Err(crate::admin_common::explain_miss(self, event_id).await);
        };
        let mut bound = Vec::new();
        if with_now {
            bound.push(self.now(&mut tx).await?.into());
        }
        bound.push(event_id.to_string().into());
        tx.execute(query, bound).await?;
        let attempts = if kind == AttemptKind::Requeued {
            0
        } else {
            attempts
        };
        let entry = HistoryEntry {
            event_id,
            kind,
            actor: action.operator.as_str(),
            error_class: None,
            detail: action.reason.as_str(),
            attempts,
        };
        self.record(&mut tx, &[entry]).await?;
        D::commit(tx).await
    }

    async fn fetch_alone(&self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError> {
        self.driver.connect().await?.fetch(sql, params).await
    }
}

#[async_trait]
impl<D: Driver> OutboxAdmin for Protocol<D> {
    async fn stats(&self) -> Result<Vec<EventTypeStats>, StoreError> {
        during("stats", || self.events(), async move {
            self.sync_clock().await?;
            let mut conn = self.driver.connect().await?;
            let now_us = self.now(&mut conn).await?;
            let now = from_micros(now_us)?;
            let rows = conn
                .fetch(
                    &self.queries.stats,
                    vec![now_us.into(), now_us.into(), now_us.into()],
                )
                .await?;
            rows.iter().map(|r| type_stats(r, now)).collect()
        })
        .await
    }

    async fn held_back(&self) -> Result<Vec<HeldBack>, StoreError> {
        during("held_back", || self.events(), async move {
            self.sync_clock().await?;
            let mut conn = self.driver.connect().await?;
            let now = self.now(&mut conn).await?;
            let rows = conn
                .fetch(&self.queries.held_back, vec![now.into(); 6])
                .await?;
            let r = rows
                .first()
                .ok_or_else(|| StoreError::fatal("held_back returned no row"))?;
            held_back(r)
        })
        .await
    }

    async fn event_state(&self, event_id: EventId) -> Result<Option<EventState>, StoreError> {
        during("event_state", || self.events(), async move {
            let rows = self
                .fetch_alone(&self.queries.event_state, vec![event_id.to_string().into()])
                .await?;
            rows.first().map(event_state).transpose()
        })
        .await
    }

    async fn failed_events(&self, limit: usize) -> Result<Vec<FailedEvent>, StoreError> {
        during("failed_events", || self.events(), async move {
            let rows = self
                .fetch_alone(
                    &self.queries.failed_events,
                    vec![crate::param::limit(limit)],
                )
                .await?;
            let mut failed = Vec::with_capacity(rows.len());
            for mut r in rows {
                let event = raw_event(&mut r)?.decode().unwrap_or_else(|u| u.event);
                failed.push(FailedEvent {
                    history: self.history(event.event_id).await?,
                    blocks_key: r.bool("blocks_key")?,
                    superseded_by: superseded_by(&r)?,
                    event,
                });
            }
            Ok(failed)
        })
        .await
    }

    async fn history(&self, event_id: EventId) -> Result<Vec<AttemptRecord>, StoreError> {
        during("history", || self.events(), async move {
            if self.event_state(event_id).await?.is_none() {
                return Err(StoreError::NotFound(event_id));
            }
            self.fetch_alone(&self.queries.history, vec![event_id.to_string().into()])
                .await?
                .iter()
                .map(crate::admin_common::attempt_record)
                .collect()
        })
        .await
    }

    async fn blocked_keys(&self) -> Result<Vec<BlockedKey>, StoreError> {
        during("blocked_keys", || self.events(), async move {
            self.fetch_alone(&self.queries.blocked_keys, Vec::new())
                .await?
                .iter()
                .map(blocked_key)
                .collect()
        })
        .await
    }

    async fn requeue(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        during("requeue", || self.events(), async move {
            let query = self.queries.requeue.clone();
            self.operator_update(&query, event_id, AttemptKind::Requeued, action, true)
                .await
        })
        .await
    }

    async fn skip(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        during("skip", || self.events(), async move {
            let query = self.queries.skip.clone();
            self.operator_update(&query, event_id, AttemptKind::Skipped, action, false)
                .await
        })
        .await
    }

    /// The replacement is enqueued at the end of its key; a blocking
    /// original keeps blocking everything of the key but its replacement
    /// until the replacement is published, so it still goes first.
    async fn supersede(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        during("supersede", || self.events(), async move {
            let mut tx = self.driver.begin(false).await?;
            let Some(attempts) = self.lock_failed(&mut tx, event_id).await? else {
                drop(tx);
                return Err(crate::admin_common::explain_miss(self, event_id).await);
            };
            let outcome = self
                .enqueue(&mut tx, std::slice::from_ref(&replacement))
                .await?[0];
            if outcome == EnqueueOutcome::AlreadyExists {
                return Ok(outcome);
            }
            tx.execute(
                &self.queries.supersede_mark,
                vec![
                    replacement.event_id.to_string().into(),
                    event_id.to_string().into(),
                ],
            )
            .await?;
            let detail = format!("superseded by {}: {}", replacement.event_id, action.reason);
            let entry = HistoryEntry {
                event_id,
                kind: AttemptKind::Superseded,
                actor: action.operator.as_str(),
                error_class: None,
                detail: detail.as_str(),
                attempts,
            };
            self.record(&mut tx, &[entry]).await?;
            D::commit(tx).await?;
            Ok(outcome)
        })
        .await
    }

    async fn purge_published(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        during("purge_published", || self.events(), async move {
            self.sync_clock().await?;
            let mut tx = self.begin_relay().await?;
            let cutoff = self
                .now(&mut tx)
                .await?
                .saturating_sub(crate::param::micros(older_than));
            let doomed = tx
                .fetch(
                    &self.queries.purge_select,
                    vec![cutoff.into(), crate::param::limit(batch_size)],
                )
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
        })
        .await
    }

    async fn relays(&self) -> Result<Vec<RelayStatus>, StoreError> {
        during("relays", || self.events(), async move {
            self.fetch_alone(&self.queries.relays, Vec::new())
                .await?
                .iter()
                .map(relay_status)
                .collect()
        })
        .await
    }
}
