//! `OutboxAdmin` on each dialect's `Protocol`, written once: every call
//! runs its dialect's work inside [`during`] (which names the operation
//! and table in an error), and writes sync store time first (tests shift
//! it). The reads every dialect does alike are here; each dialect's `admin.rs` holds the rest as inherent methods
//! (`stats_now`, `held_back_now`, `failed_now`, `operator_update`,
//! `supersede_now`, `purge_now`, `fetch_alone`) and maps an event's state.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::store::{
    AttemptKind, AttemptRecord, BlockedKey, EnqueueOutcome, EventState, EventTypeStats,
    FailedCount, FailedEvent, FailedPage, HeldBack, OperatorAction, OutboxAdmin, RelayStatus,
};
use outbox_core::{EventId, NewEvent, StoreError};

use crate::admin_common::{attempt_record, blocked_key, relay_status};
use crate::error::during;

/// `OutboxAdmin` for `$dialect::Protocol<D>`; `$event_state` maps an
/// `event_state` row.
macro_rules! admin_on_protocol {
    ($dialect:ident, $event_state:path) => {
        #[async_trait]
        impl<D: crate::$dialect::Driver> OutboxAdmin for crate::$dialect::Protocol<D> {
            async fn stats(&self) -> Result<Vec<EventTypeStats>, StoreError> {
                during("stats", || self.events(), self.stats_now()).await
            }

            async fn held_back(&self) -> Result<Vec<HeldBack>, StoreError> {
                during("held_back", || self.events(), self.held_back_now()).await
            }

            async fn event_state(&self, id: EventId) -> Result<Option<EventState>, StoreError> {
                during("event_state", || self.events(), async move {
                    let rows = self
                        .fetch_alone(&self.queries.admin.event_state, vec![id.into()])
                        .await?;
                    rows.first().map($event_state).transpose()
                })
                .await
            }

            async fn failed_events(&self, limit: usize) -> Result<Vec<FailedEvent>, StoreError> {
                let page = FailedPage::first(limit);
                during("failed_events", || self.events(), self.failed_now(&page)).await
            }

            async fn failed_page(&self, page: &FailedPage) -> Result<Vec<FailedEvent>, StoreError> {
                during("failed_page", || self.events(), self.failed_now(page)).await
            }

            async fn count_failed(&self, page: &FailedPage) -> Result<FailedCount, StoreError> {
                during("count_failed", || self.events(), async move {
                    let (sql, params) = self.queries.admin.failed_events.for_count(page);
                    let rows = self.fetch_alone(sql, params).await?;
                    match rows.first() {
                        Some(row) => Ok(FailedCount::new(
                            row.count("failed")?,
                            row.opt_int("last_sequence")?,
                        )),
                        None => Ok(FailedCount::default()),
                    }
                })
                .await
            }

            async fn failed_event(&self, id: EventId) -> Result<Option<FailedEvent>, StoreError> {
                during("failed_event", || self.events(), async move {
                    let sql = &self.queries.admin.failed_event;
                    let rows = self.failed_rows(sql, vec![id.into()]).await?;
                    Ok(rows.into_iter().next())
                })
                .await
            }

            async fn history(&self, id: EventId) -> Result<Vec<AttemptRecord>, StoreError> {
                during("history", || self.events(), async move {
                    if self.event_state(id).await?.is_none() {
                        return Err(StoreError::NotFound(id));
                    }
                    let rows = self.fetch_alone(&self.queries.admin.history, vec![id.into()]);
                    rows.await?.iter().map(attempt_record).collect()
                })
                .await
            }

            async fn blocked_keys(&self) -> Result<Vec<BlockedKey>, StoreError> {
                during("blocked_keys", || self.events(), async move {
                    let rows = self.fetch_alone(&self.queries.admin.blocked_keys, vec![]);
                    rows.await?.iter().map(blocked_key).collect()
                })
                .await
            }

            async fn requeue(
                &self,
                id: EventId,
                action: &OperatorAction,
            ) -> Result<(), StoreError> {
                let query = &self.queries.admin.requeue;
                during("requeue", || self.events(), async move {
                    self.sync_clock().await?;
                    self.operator_update(query, id, AttemptKind::Requeued, action)
                        .await
                })
                .await
            }

            async fn skip(&self, id: EventId, action: &OperatorAction) -> Result<(), StoreError> {
                let query = &self.queries.admin.skip;
                during("skip", || self.events(), async move {
                    self.sync_clock().await?;
                    self.operator_update(query, id, AttemptKind::Skipped, action)
                        .await
                })
                .await
            }

            async fn requeue_each(
                &self,
                ids: &[EventId],
                action: &OperatorAction,
            ) -> Result<Vec<EventId>, StoreError> {
                let each = self.each_now(ids, AttemptKind::Requeued, action);
                during("requeue_each", || self.events(), each).await
            }

            async fn skip_each(
                &self,
                ids: &[EventId],
                action: &OperatorAction,
            ) -> Result<Vec<EventId>, StoreError> {
                let each = self.each_now(ids, AttemptKind::Skipped, action);
                during("skip_each", || self.events(), each).await
            }

            async fn supersede(
                &self,
                id: EventId,
                replacement: NewEvent,
                action: &OperatorAction,
            ) -> Result<EnqueueOutcome, StoreError> {
                during("supersede", || self.events(), async move {
                    self.sync_clock().await?;
                    self.supersede_now(id, replacement, action).await
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
                    self.purge_now(older_than, batch_size).await
                })
                .await
            }

            async fn relays(&self) -> Result<Vec<RelayStatus>, StoreError> {
                during("relays", || self.events(), async move {
                    let rows = self.fetch_alone(&self.queries.admin.relays, vec![]);
                    rows.await?.iter().map(relay_status).collect()
                })
                .await
            }

            async fn last_sequence(&self) -> Result<Option<i64>, StoreError> {
                during("last_sequence", || self.events(), async move {
                    let rows = self.fetch_alone(&self.queries.admin.last_sequence, vec![]);
                    match rows.await?.first() {
                        Some(row) => row.opt_int("last_sequence"),
                        None => Ok(None),
                    }
                })
                .await
            }
        }
    };
}

admin_on_protocol!(mysql, crate::admin_common::event_state);
admin_on_protocol!(postgres, crate::postgres::admin::event_state);
admin_on_protocol!(sqlite, crate::admin_common::event_state);

/// The admin reads MySQL and SQLite run alike (their statements bind
/// scalars and compute in SQL): on a pooled connection, with store time
/// bound `$stats` times to the stats and `$held_back` times to what holds
/// publication back (MySQL's `?` binds each use; SQLite's `?1` once).
macro_rules! scalar_admin_reads {
    ($dialect:ident, $stats:expr, $held_back:expr) => {
        impl<D: crate::$dialect::Driver> crate::$dialect::Protocol<D> {
            /// Rows of `sql` (parameters `params`) on a pooled connection.
            pub(crate) async fn fetch_alone(
                &self,
                sql: &str,
                params: Vec<crate::param::Param>,
            ) -> Result<Vec<crate::row::Row>, StoreError> {
                use crate::$dialect::Exec;
                self.driver.connect().await?.fetch(sql, params).await
            }

            async fn stats_now(&self) -> Result<Vec<EventTypeStats>, StoreError> {
                use crate::$dialect::Exec;
                self.sync_clock().await?;
                let mut conn = self.driver.connect().await?;
                let now_us = self.now(&mut conn).await?;
                let now = crate::row::from_micros(now_us)?;
                let rows = conn.fetch(&self.queries.admin.stats, vec![now_us.into(); $stats]);
                let rows = rows.await?;
                rows.iter()
                    .map(|r| crate::admin_common::type_stats(r, now))
                    .collect()
            }

            async fn held_back_now(&self) -> Result<Vec<HeldBack>, StoreError> {
                use crate::$dialect::Exec;
                self.sync_clock().await?;
                let mut conn = self.driver.connect().await?;
                let now = self.now(&mut conn).await?;
                let rows = conn.fetch(&self.queries.admin.held_back, vec![now.into(); $held_back]);
                let rows = rows.await?;
                let r = rows
                    .first()
                    .ok_or_else(|| StoreError::fatal("held_back returned no row"))?;
                crate::admin_common::held_back(r)
            }

            async fn failed_now(&self, page: &FailedPage) -> Result<Vec<FailedEvent>, StoreError> {
                let (sql, params) = self.queries.admin.failed_events.for_page(page);
                self.failed_rows(sql, params).await
            }

            /// The failed events `sql` selects, each with its history.
            async fn failed_rows(
                &self,
                sql: &str,
                params: Vec<crate::param::Param>,
            ) -> Result<Vec<FailedEvent>, StoreError> {
                let rows = self.fetch_alone(sql, params).await?;
                let mut failed = Vec::with_capacity(rows.len());
                for mut r in rows {
                    // A row that does not decode is listed as far as it
                    // reads; its history says why it failed.
                    let event = crate::$dialect::raw_event(&mut r)?.decode();
                    let event = event.unwrap_or_else(|u| u.event);
                    failed.push(FailedEvent {
                        history: self.history(event.event_id).await?,
                        blocks_key: r.bool("blocks_key")?,
                        superseded_by: crate::admin_common::superseded_by(&r)?,
                        event,
                    });
                }
                Ok(failed)
            }
        }
    };
}

scalar_admin_reads!(mysql, 3, 6);
scalar_admin_reads!(sqlite, 1, 1);

/// `each_now` (what `requeue_each` and `skip_each` run) for `$dialect`,
/// which has no set-based operator update: one event at a time.
macro_rules! one_at_a_time {
    ($dialect:ident) => {
        impl<D: crate::$dialect::Driver> crate::$dialect::Protocol<D> {
            async fn each_now(
                &self,
                ids: &[EventId],
                kind: AttemptKind,
                action: &OperatorAction,
            ) -> Result<Vec<EventId>, StoreError> {
                outbox_core::store::one_at_a_time(ids, |id| async move {
                    if kind == AttemptKind::Requeued {
                        self.requeue(id, action).await
                    } else {
                        self.skip(id, action).await
                    }
                })
                .await
            }
        }
    };
}

one_at_a_time!(mysql);
one_at_a_time!(sqlite);
