//! What PostgreSQL's admin does its own way (the rest is
//! `admin_traits.rs`): stats and purge in SQL functions, what holds
//! publication back with open transactions, histories in one read, and
//! operator actions that let a key's parked rows go.

use std::collections::HashMap;
use std::time::Duration;

use outbox_core::store::{
    AttemptKind, AttemptRecord, EnqueueOutcome, EventState, EventTypeStats, FailedEvent,
    FailedPage, HeldBack, OpenTransaction, OperatorAction,
};
use outbox_core::{EventId, NewEvent, StoreError};

use super::driver::{Driver, Exec, Param, Row};
use super::protocol::Protocol;
use super::statements::{limit, millis, raw_event};
use crate::admin_common::{held_back, type_stats};
use crate::codes;
use crate::history::superseded_detail;
use crate::validate::{check_event, headers_json};

fn attempt_record(row: &Row) -> Result<(EventId, AttemptRecord), StoreError> {
    Ok((
        row.event_id("event_id")?,
        crate::admin_common::attempt_record(row)?,
    ))
}

/// An `event_state` row: PostgreSQL's status codes.
pub(crate) fn event_state(row: &Row) -> Result<EventState, StoreError> {
    let status = row.int("status")?;
    Ok(match status {
        s if s == i64::from(codes::PENDING) => EventState::Pending {
            available_at: row.time("available_at")?,
            attempts: row.int("attempts")? as u32,
        },
        s if s == i64::from(codes::IN_FLIGHT) => EventState::InFlight {
            owner: row.opt_text("lease_owner")?.unwrap_or_default(),
            lease_expires_at: row.time("lease_expires_at")?,
        },
        s if s == i64::from(codes::PUBLISHED) => EventState::Published {
            published_at: row.time("published_at")?,
        },
        _ => EventState::Failed {
            blocks_key: row.bool("blocks_key")?,
            superseded_by: row.opt_event_id("superseded_by")?,
        },
    })
}

impl<D: Driver> Protocol<D> {
    /// Appends an operator action to the event's history.
    async fn record_action(
        &self,
        conn: &mut (impl Exec + ?Sized),
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
        detail: &str,
        attempts: i64,
    ) -> Result<(), StoreError> {
        let params = vec![
            event_id.into(),
            codes::attempt_kind_code(kind).into(),
            action.operator.as_str().into(),
            detail.into(),
            Param::Int(attempts as i32),
        ];
        conn.execute(&self.queries.record, params).await?;
        Ok(())
    }

    /// Runs an operator update that returns `attempts` and the key, records
    /// it, and lets the key's parked rows go if nothing blocks it any more.
    /// `NotFound` or `WrongState` if it matched no row.
    pub(crate) async fn operator_update(
        &self,
        sql: &str,
        event_id: EventId,
        kind: AttemptKind,
        action: &OperatorAction,
    ) -> Result<(), StoreError> {
        let mut tx = self.driver.begin().await?;
        let rows = tx.fetch(sql, vec![event_id.into()]).await?;
        let Some(row) = rows.first() else {
            drop(tx);
            return Err(crate::admin_common::explain_miss(self, event_id).await);
        };
        let key = row.text("partition_key")?;
        self.record_action(
            &mut tx,
            event_id,
            kind,
            action,
            &action.reason,
            row.int("attempts")?,
        )
        .await?;
        tx.execute(&self.queries.unpark_keys, vec![Param::Texts(vec![key])])
            .await?;
        D::commit(tx).await
    }

    /// A requeue or skip (`kind`) of a set of events in one transaction:
    /// one statement changes and records them, one more lets the keys they
    /// unblocked have their parked rows back. Returns the events it changed.
    pub(crate) async fn each_now(
        &self,
        event_ids: &[EventId],
        kind: AttemptKind,
        action: &OperatorAction,
    ) -> Result<Vec<EventId>, StoreError> {
        if event_ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = if kind == AttemptKind::Requeued {
            &self.queries.requeue_each
        } else {
            &self.queries.skip_each
        };
        self.sync_clock().await?;
        let mut tx = self.driver.begin().await?;
        let params = vec![
            Param::Uuids(event_ids.iter().map(|id| *id.as_uuid()).collect()),
            codes::attempt_kind_code(kind).into(),
            action.operator.as_str().into(),
            action.reason.as_str().into(),
        ];
        let rows = tx.fetch(sql, params).await?;
        let mut done = Vec::with_capacity(rows.len());
        let mut keys = std::collections::BTreeSet::new();
        for row in &rows {
            done.push(row.event_id("event_id")?);
            keys.insert(row.text("partition_key")?);
        }
        if !keys.is_empty() {
            let keys = Param::Texts(keys.into_iter().collect());
            tx.execute(&self.queries.unpark_keys, vec![keys]).await?;
        }
        D::commit(tx).await?;
        Ok(done)
    }

    /// Rows of `sql` (parameters `params`) on a pooled connection.
    pub(crate) async fn fetch_alone(
        &self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Vec<Row>, StoreError> {
        let mut conn = self.driver.connect().await?;
        conn.fetch(sql, params).await
    }

    pub(crate) async fn stats_now(&self) -> Result<Vec<EventTypeStats>, StoreError> {
        self.sync_clock().await?;
        let rows = self.fetch_alone(&self.queries.admin.stats, vec![]).await?;
        rows.iter().map(|r| type_stats(r, r.time("now")?)).collect()
    }

    pub(crate) async fn held_back_now(&self) -> Result<Vec<HeldBack>, StoreError> {
        self.sync_clock().await?;
        let rows = self
            .fetch_alone(&self.queries.admin.held_back, vec![])
            .await?;
        let r = rows
            .first()
            .ok_or_else(|| StoreError::fatal("no row from the held-back query"))?;
        let mut held = held_back(r)?;
        // Seeing other sessions needs pg_read_all_stats (or the same role);
        // without it the list is what the server shows.
        let transactions = self
            .fetch_alone(&self.queries.open_transactions, vec![])
            .await?
            .iter()
            .map(|t| {
                Ok(OpenTransaction {
                    pid: t.int("pid")?,
                    database: t.text("database")?,
                    started_at: t.time("xact_start")?,
                    state: t.text("state")?,
                    query_started_at: t.opt_time("query_start")?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        if !transactions.is_empty() {
            held.push(HeldBack::OpenTransactions { transactions });
        }
        Ok(held)
    }

    pub(crate) async fn failed_now(
        &self,
        page: &FailedPage,
    ) -> Result<Vec<FailedEvent>, StoreError> {
        let (sql, params) = self.queries.admin.failed_events.for_page::<Param>(page);
        self.failed_rows(sql, params).await
    }

    /// The failed events `sql` selects, each with its history.
    pub(crate) async fn failed_rows(
        &self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Vec<FailedEvent>, StoreError> {
        let rows = self.fetch_alone(sql, params).await?;
        let ids = rows
            .iter()
            .map(|r| r.event_id("event_id").map(|id| *id.as_uuid()))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let mut histories: HashMap<EventId, Vec<AttemptRecord>> = HashMap::new();
        for r in self
            .fetch_alone(&self.queries.history_many, vec![Param::Uuids(ids)])
            .await?
        {
            let (id, record) = attempt_record(&r)?;
            histories.entry(id).or_default().push(record);
        }
        rows.into_iter()
            .map(|mut r| {
                // A row that does not decode is listed as far as it reads;
                // its history says why it failed.
                let event = raw_event(&mut r)?.decode().unwrap_or_else(|u| u.event);
                Ok(FailedEvent {
                    history: histories.remove(&event.event_id).unwrap_or_default(),
                    blocks_key: r.bool("blocks_key")?,
                    superseded_by: r.opt_event_id("superseded_by")?,
                    event,
                })
            })
            .collect()
    }

    pub(crate) async fn supersede_now(
        &self,
        event_id: EventId,
        replacement: NewEvent,
        action: &OperatorAction,
    ) -> Result<EnqueueOutcome, StoreError> {
        check_event(&replacement, &self.config.limits, true)?;
        let mut tx = self.driver.begin().await?;
        let old = tx
            .fetch(&self.queries.supersede_lock, vec![event_id.into()])
            .await?;
        let Some(old) = old.first() else {
            drop(tx);
            return Err(crate::admin_common::explain_miss(self, event_id).await);
        };
        let key = old.text("partition_key")?;
        let params = vec![
            Param::OptBigInt(old.opt_int("position")?),
            replacement.event_id.into(),
            replacement.aggregate_type.as_str().into(),
            replacement.aggregate_id.as_str().into(),
            replacement.event_type.as_str().into(),
            replacement.partition_key.as_str().into(),
            replacement.payload.as_str().into(),
            Param::Int(replacement.payload_version as i32),
            headers_json(&replacement).into(),
            Param::OptBigInt(self.config.delay_ms(replacement.available_at)),
        ];
        let inserted = tx.fetch(&self.queries.supersede_insert, params).await?;
        let Some(inserted) = inserted.first() else {
            return Ok(EnqueueOutcome::AlreadyExists);
        };
        tx.execute(
            &self.queries.supersede_mark,
            vec![event_id.into(), replacement.event_id.into()],
        )
        .await?;
        let detail = superseded_detail(&replacement, action);
        self.record_action(
            &mut tx,
            event_id,
            AttemptKind::Superseded,
            action,
            &detail,
            old.int("attempts")?,
        )
        .await?;
        tx.execute(&self.queries.unpark_keys, vec![Param::Texts(vec![key])])
            .await?;
        let sequence = inserted.int("sequence")?;
        D::commit(tx).await?;
        Ok(EnqueueOutcome::Inserted { sequence })
    }

    pub(crate) async fn purge_now(&self, age: Duration, most: usize) -> Result<u64, StoreError> {
        let mut conn = self.driver.connect().await?;
        let params = vec![Param::BigInt(millis(age)), limit(most)];
        let purged = conn
            .fetch(&self.queries.purge, params)
            .await?
            .first()
            .map(|r| r.count("count"))
            .transpose()?
            .unwrap_or(0);
        if purged < most as u64 {
            // Nothing the cutoff allows is left: older cursor-log entries
            // describe no row any more.
            conn.execute(&self.queries.prune_cursor_log, vec![]).await?;
        }
        Ok(purged)
    }
}
