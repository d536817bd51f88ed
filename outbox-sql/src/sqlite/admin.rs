//! [`OutboxAdmin`] on the SQLite [`Protocol`].

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::store::{
    AttemptKind, AttemptRecord, BlockedKey, EnqueueOutcome, EventState, EventTypeStats,
    FailedEvent, HeldBack, OperatorAction, OutboxAdmin, RelayStatus,
};
use outbox_core::{EventId, NewEvent, StoreError};

use super::{Driver, Exec, Protocol, raw_event};
use crate::admin_common::{
    attempt_record, blocked_key, event_state, explain_miss, held_back, relay_status, superseded_by,
    type_stats,
};
use crate::error::during;
use crate::history::HistoryEntry;
use crate::param::{limit, micros};
use crate::row::from_micros;
use crate::validate::{check_event, headers_json};

impl<D: Driver> Protocol<D> {
    async fn operator_update(
        &self,
        query: &str,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
    ) -> Result<(), StoreError> {
        self.sync_clock().await?;
        let mut tx = self.driver.begin().await?;
        let now = self.now(&mut tx).await?;
        let rows = tx
            .fetch(query, vec![event_id.to_string().into(), now.into()])
            .await?;
        let Some(row) = rows.first() else {
            drop(tx);
            return Err(explain_miss(self, event_id).await);
        };
        let entry = HistoryEntry {
            event_id,
            kind,
            actor: action.operator.as_str(),
            error_class: None,
            detail: action.reason.as_str(),
            attempts: row.int("attempts")?,
        };
        self.record(&mut tx, &[entry]).await?;
        D::commit(tx).await
    }

    /// Rows of `query` (parameters `params`) on a pooled connection.
    async fn fetch_alone(
        &self,
        query: &str,
        params: Vec<super::Param>,
    ) -> Result<Vec<super::Row>, StoreError> {
        self.driver.connect().await?.fetch(query, params).await
    }

    async fn supersede_now(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        check_event(&replacement, &self.config.limits, false)?;
        self.sync_clock().await?;
        let mut tx = self.driver.begin().await?;
        let now = self.now(&mut tx).await?;
        let old = tx
            .fetch(
                &self.queries.supersede_lock,
                vec![event_id.to_string().into()],
            )
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
        let mark = vec![
            event_id.to_string().into(),
            replacement.event_id.to_string().into(),
        ];
        tx.execute(&self.queries.supersede_mark, mark).await?;
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
        let sequence = inserted.int("sequence")?;
        D::commit(tx).await?;
        Ok(EnqueueOutcome::Inserted { sequence })
    }

    async fn purge_now(&self, older_than: Duration, batch_size: usize) -> Result<u64, StoreError> {
        self.sync_clock().await?;
        let mut tx = self.driver.begin().await?;
        let cutoff = self.now(&mut tx).await?.saturating_sub(micros(older_than));
        let params = || vec![cutoff.into(), limit(batch_size)];
        tx.execute(&self.queries.purge_history, params()).await?;
        let done = tx.execute(&self.queries.purge, params()).await?;
        D::commit(tx).await?;
        Ok(done)
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
            let rows = conn.fetch(&self.queries.stats, vec![now_us.into()]).await?;
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
                .fetch(&self.queries.held_back, vec![now.into()])
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

    async fn failed_events(&self, limit_to: usize) -> Result<Vec<FailedEvent>, StoreError> {
        during("failed_events", || self.events(), async move {
            let rows = self
                .fetch_alone(&self.queries.failed_events, vec![limit(limit_to)])
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
                .map(attempt_record)
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
        let query = &self.queries.requeue;
        let update = self.operator_update(query, event_id, AttemptKind::Requeued, action);
        during("requeue", || self.events(), update).await
    }

    async fn skip(&self, event_id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
        let query = &self.queries.skip;
        let update = self.operator_update(query, event_id, AttemptKind::Skipped, action);
        during("skip", || self.events(), update).await
    }

    async fn supersede(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        let superseding = self.supersede_now(event_id, replacement, action);
        during("supersede", || self.events(), superseding).await
    }

    async fn purge_published(
        &self,
        older_than: Duration,
        batch_size: usize,
    ) -> Result<u64, StoreError> {
        let purging = self.purge_now(older_than, batch_size);
        during("purge_published", || self.events(), purging).await
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
