//! [`SqliteStore`] as a relay's store: claims in `BEGIN IMMEDIATE`
//! transactions, settlements fenced by lease id, expired leases reaped and
//! their crash blamed.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use outbox_core::store::{
    AttemptKind, ClaimRequest, ClaimedBatch, ClaimedEvent, CrashVerdict, FencingToken, Heartbeat,
    Lease, Nack, NackAction, OutboxStore, Release, SettleReport, SuspectAllowance,
};
use outbox_core::{EventId, Ordering, PoisonPolicy, StoreError, StoredEvent, UnreadableEvent};
use serde_json::json;
use sqlx::{Row, Sqlite, Transaction};

use super::row;
use super::store::SqliteStore;
use crate::blame::{InFlight, blame, new_lease_id, reap};
use crate::codes;
use crate::error::ResultExt;
use crate::history::HistoryEntry;

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        crate::error::during(
            "claim_batch",
            || self.config().tables.events(),
            async move {
                self.sync_clock().await?;
                let mut tx = self.begin_immediate().await?;
                let now = self.now(&mut tx).await?;
                let expires = now.saturating_add(
                    i64::try_from(request.lease_duration.as_micros()).unwrap_or(i64::MAX),
                );
                self.reap(&mut tx, now).await?;
                let block = request.poison == PoisonPolicy::Block;
                let looped = sqlx::query(&self.queries.crash_loops)
                    .bind(now)
                    .bind(i64::from(request.crash_loop_limit))
                    .bind(block)
                    .fetch_all(&mut *tx)
                    .await
                    .store()?;
                let crash_looped: Vec<StoredEvent> = looped
                    .iter()
                    .map(|r| Ok(row::raw_event(r)?.decode().unwrap_or_else(|u| u.event)))
                    .collect::<Result<_, StoreError>>()?;
                let detail = format!(
                    "{} publish attempts started and none finished",
                    request.crash_loop_limit
                );
                let entries: Vec<_> = crash_looped
                    .iter()
                    .map(|e| HistoryEntry {
                        event_id: e.event_id,
                        kind: AttemptKind::CrashLoop,
                        actor: request.owner.as_str(),
                        error_class: None,
                        detail: detail.as_str(),
                        attempts: i64::from(e.attempts),
                    })
                    .collect();
                self.record(&mut tx, &entries).await?;

                let (query, ordered) = match request.ordering {
                    Ordering::PerKey => (&self.queries.claim_per_key, true),
                    Ordering::Unordered => (&self.queries.claim_unordered, false),
                };
                let candidates: Vec<(i64, String, Option<u32>)> = sqlx::query(query)
                    .bind(now)
                    .bind(request.limit.min(i64::MAX as usize) as i64)
                    .fetch_all(&mut *tx)
                    .await
                    .store()?
                    .iter()
                    .map(|r| {
                        Ok((
                            r.try_get("sequence").store()?,
                            r.try_get("partition_key").store()?,
                            row::suspect(r)?,
                        ))
                    })
                    .collect::<Result<_, StoreError>>()?;
                let sequences: Vec<i64> = candidates.iter().map(|(s, _, _)| *s).collect();
                let mut rows: HashMap<i64, (i64, Result<StoredEvent, UnreadableEvent>)> =
                    HashMap::new();
                for r in sqlx::query(&self.queries.read_rows)
                    .bind(json!(sequences).to_string())
                    .fetch_all(&mut *tx)
                    .await
                    .store()?
                {
                    let raw = row::raw_event(&r)?;
                    rows.insert(
                        raw.sequence,
                        (r.try_get("fencing_token").store()?, raw.decode()),
                    );
                }
                // A crash suspect beyond the lease's allowance, or a row that
                // does not decode under Block, ends its key's prefix in this
                // batch.
                let mut stopped: HashSet<&str> = HashSet::new();
                let mut suspects = SuspectAllowance::default();
                let mut chosen = Vec::new();
                let mut unreadable = Vec::new();
                for (sequence, key, suspect) in &candidates {
                    if ordered && stopped.contains(key.as_str()) {
                        continue;
                    }
                    if let Some(span) = suspect {
                        if !suspects.admit(*span) {
                            stopped.insert(key);
                            continue;
                        }
                    }
                    match &rows[sequence].1 {
                        Ok(_) => chosen.push(*sequence),
                        Err(bad) => {
                            unreadable.push(bad.clone());
                            if block {
                                stopped.insert(key);
                            }
                        }
                    }
                }
                if !unreadable.is_empty() {
                    let bad: Vec<i64> = unreadable.iter().map(|u| u.event.sequence).collect();
                    sqlx::query(&self.queries.fail_rows)
                        .bind(json!(bad).to_string())
                        .bind(block)
                        .execute(&mut *tx)
                        .await
                        .store()?;
                    let entries: Vec<_> = unreadable
                        .iter()
                        .map(|u| HistoryEntry {
                            event_id: u.event.event_id,
                            kind: AttemptKind::Unreadable,
                            actor: request.owner.as_str(),
                            error_class: None,
                            detail: u.reason.as_str(),
                            attempts: i64::from(u.event.attempts),
                        })
                        .collect();
                    self.record(&mut tx, &entries).await?;
                }
                let mut events = Vec::with_capacity(chosen.len());
                if !chosen.is_empty() {
                    sqlx::query(&self.queries.lease_rows)
                        .bind(json!(chosen).to_string())
                        .bind(new_lease_id())
                        .bind(request.owner.as_str())
                        .bind(expires)
                        .execute(&mut *tx)
                        .await
                        .store()?;
                    let lease_expires_at = row::from_micros(expires)?;
                    for sequence in &chosen {
                        let (token, decoded) = &rows[sequence];
                        let event = decoded.clone().expect("chosen rows decode");
                        events.push(ClaimedEvent {
                            lease: Lease {
                                sequence: *sequence,
                                event_id: event.event_id,
                                fencing_token: FencingToken(token + 1),
                                lease_expires_at,
                            },
                            event,
                        });
                    }
                }
                tx.commit().await.store()?;
                Ok(ClaimedBatch {
                    events,
                    crash_looped,
                    unreadable,
                })
            },
        )
        .await
    }

    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        crate::error::during("ack", || self.config().tables.events(), async move {
            if leases.is_empty() {
                return Ok(SettleReport::default());
            }
            self.sync_clock().await?;
            let batch = leases
                .iter()
                .map(|l| json!([l.sequence, l.fencing_token.0]))
                .collect();
            self.settle_json(
                &self.queries.ack,
                batch,
                true,
                leases.iter().map(|l| l.event_id),
            )
            .await
        })
        .await
    }

    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        crate::error::during("nack", || self.config().tables.events(), async move {
            if nacks.is_empty() {
                return Ok(SettleReport::default());
            }
            self.sync_clock().await?;
            let mut tx = self.begin_immediate().await?;
            let now = self.now(&mut tx).await?;
            let batch: Vec<_> = nacks
                .iter()
                .map(|n| {
                    let (status, blocks, available) = match &n.action {
                        NackAction::Retry { after } => (
                            codes::PENDING,
                            false,
                            Some(now.saturating_add(
                                i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
                            )),
                        ),
                        NackAction::Fail { block_key, .. } => (codes::FAILED, *block_key, None),
                    };
                    json!({"s": n.lease.sequence, "t": n.lease.fencing_token.0, "st": status,
                           "b": blocks, "a": available})
                })
                .collect();
            let rows = sqlx::query(&self.queries.nack)
                .bind(serde_json::Value::Array(batch).to_string())
                .fetch_all(&mut *tx)
                .await
                .store()?;
            let by_id: HashMap<EventId, &Nack> =
                nacks.iter().map(|n| (n.lease.event_id, n)).collect();
            let mut settled = HashSet::new();
            let mut entries = Vec::with_capacity(rows.len());
            let mut owners = Vec::with_capacity(rows.len());
            for r in &rows {
                let id = row::event_id(r, "event_id")?;
                settled.insert(id);
                owners.push((
                    id,
                    r.try_get::<String, _>("lease_owner").store()?,
                    r.try_get::<i64, _>("attempts").store()?,
                ));
            }
            for (id, owner, attempts) in &owners {
                let nack = by_id[id];
                entries.push(HistoryEntry {
                    event_id: *id,
                    kind: codes::nack_kind(&nack.action),
                    actor: owner.as_str(),
                    error_class: Some(nack.error_class.as_str()),
                    detail: nack.error.as_str(),
                    attempts: *attempts,
                });
            }
            self.record(&mut tx, &entries).await?;
            tx.commit().await.store()?;
            Ok(SettleReport {
                applied: settled.len(),
                fenced: nacks
                    .iter()
                    .map(|n| n.lease.event_id)
                    .filter(|id| !settled.contains(id))
                    .collect(),
            })
        })
        .await
    }

    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        crate::error::during("release", || self.config().tables.events(), async move {
            if releases.is_empty() {
                return Ok(SettleReport::default());
            }
            let mut tx = self.begin_immediate().await?;
            // Rows whose publishing had started are blamed as after a crash.
            let started: Vec<i64> = releases
                .iter()
                .filter(|r| r.attempt_started)
                .map(|r| r.lease.sequence)
                .collect();
            let mut judged: HashMap<i64, CrashVerdict> = HashMap::new();
            if !started.is_empty() {
                let held: Vec<(i64, i64, Option<u32>)> = sqlx::query(&self.queries.held)
                    .bind(json!(started).to_string())
                    .fetch_all(&mut *tx)
                    .await
                    .store()?
                    .iter()
                    .map(|r| {
                        Ok((
                            r.try_get("sequence").store()?,
                            r.try_get("lease_id").store()?,
                            row::suspect(r)?,
                        ))
                    })
                    .collect::<Result<_, StoreError>>()?;
                judged = blame(&held).into_iter().map(|v| (v.sequence, v)).collect();
            }
            let batch: Vec<_> = releases
                .iter()
                .map(|r| {
                    let verdict = judged.get(&r.lease.sequence);
                    json!([
                        r.lease.sequence,
                        r.lease.fencing_token.0,
                        r.attempt_started,
                        i64::from(verdict.is_some_and(|v| v.blamed)),
                        verdict.map_or(0, |v| v.suspect_span)
                    ])
                })
                .collect();
            let rows = sqlx::query(&self.queries.release)
                .bind(serde_json::Value::Array(batch).to_string())
                .fetch_all(&mut *tx)
                .await
                .store()?;
            tx.commit().await.store()?;
            let settled: HashSet<EventId> = rows
                .iter()
                .map(|r| row::event_id(r, "event_id"))
                .collect::<Result<_, _>>()?;
            Ok(SettleReport {
                applied: settled.len(),
                fenced: releases
                    .iter()
                    .map(|r| r.lease.event_id)
                    .filter(|id| !settled.contains(id))
                    .collect(),
            })
        })
        .await
    }

    async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        crate::error::during("heartbeat", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let mut tx = self.begin_immediate().await?;
            let now = self.now(&mut tx).await?;
            let skew_ms = (self.config.clock.now().timestamp_micros() - now) / 1000;
            let outage = beat.outage.as_ref();
            sqlx::query(&self.queries.heartbeat)
                .bind(beat.relay.as_str())
                .bind(now)
                .bind(skew_ms)
                .bind(outage.map(|o| o.destination.as_str()))
                .bind(outage.map(|o| o.reason.as_str()))
                .execute(&mut *tx)
                .await
                .store()?;
            tx.commit().await.store()
        })
        .await
    }
}

impl SqliteStore {
    /// Leases that expired with rows in flight: the rows go back to
    /// pending and the crash is blamed ([`outbox_core::store::crash_culprit`]).
    async fn reap(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        now: i64,
    ) -> Result<(), StoreError> {
        let in_flight: Vec<InFlight> = sqlx::query(&self.queries.in_flight)
            .fetch_all(&mut **tx)
            .await
            .store()?
            .iter()
            .map(|r| {
                Ok(InFlight {
                    sequence: r.try_get("sequence").store()?,
                    lease_id: r.try_get("lease_id").store()?,
                    owner: r.try_get("lease_owner").store()?,
                    expires_at: r
                        .try_get::<Option<i64>, _>("lease_expires_at")
                        .store()?
                        .unwrap_or(0),
                    unstarted: r.try_get("lease_unstarted").store()?,
                    suspect_span: row::suspect(r)?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        let reaping = reap(&in_flight, now);
        if !reaping.blamed.is_empty() {
            let batch: Vec<_> = reaping
                .blamed
                .iter()
                .map(|v| json!([v.sequence, i64::from(v.blamed), v.suspect_span]))
                .collect();
            sqlx::query(&self.queries.reap)
                .bind(serde_json::Value::Array(batch).to_string())
                .execute(&mut **tx)
                .await
                .store()?;
        }
        for (query, rows) in [
            (&self.queries.return_rows, &reaping.returned),
            (&self.queries.mark_unstarted, &reaping.unstarted),
        ] {
            if !rows.is_empty() {
                sqlx::query(query)
                    .bind(json!(rows).to_string())
                    .execute(&mut **tx)
                    .await
                    .store()?;
            }
        }
        Ok(())
    }
}
