//! The relay's side of the SQLite [`Protocol`]: claims in `BEGIN IMMEDIATE`
//! transactions, settlements fenced by lease id, expired leases reaped and
//! their crash blamed.

use std::collections::{HashMap, HashSet};

use outbox_core::store::{
    AttemptKind, ClaimRequest, ClaimedBatch, CrashVerdict, Heartbeat, Lease, Nack, Release,
    SettleReport,
};
use outbox_core::{EventId, Ordering, PoisonPolicy, StoreError, StoredEvent};
use serde_json::json;

use super::{Driver, Exec, Param, Protocol, Row, raw_event};
use crate::blame::{InFlight, blame, new_lease_id, reap, suspect_span};
use crate::choose::{ReadRows, choose, leased, nack_state};
use crate::codes;
use crate::history::HistoryEntry;
use crate::param::{limit, micros};
use crate::settle::report_by_ids;

/// A row's crash suspicion (`suspect`, `suspect_span`), as blame reads it.
fn suspect(row: &Row) -> Result<Option<u32>, StoreError> {
    Ok(suspect_span(row.bool("suspect")?, row.int("suspect_span")?))
}

/// The ids a settlement's statement returned.
pub(super) fn settled_ids(rows: &[Row]) -> Result<HashSet<EventId>, StoreError> {
    rows.iter().map(|r| r.event_id("event_id")).collect()
}

/// History entries of one kind by `actor`, one per event.
fn entries<'a>(
    events: impl Iterator<Item = (&'a StoredEvent, &'a str)>,
    kind: AttemptKind,
    actor: &'a str,
) -> Vec<HistoryEntry<'a>> {
    events
        .map(|(e, detail)| HistoryEntry {
            event_id: e.event_id,
            kind,
            actor,
            error_class: None,
            detail,
            attempts: i64::from(e.attempts),
        })
        .collect()
}

impl<D: Driver> Protocol<D> {
    /// Claims a batch (see [`outbox_core::OutboxStore::claim_batch`]).
    pub(crate) async fn claim_batch_now(
        &self,
        request: &ClaimRequest,
    ) -> Result<ClaimedBatch, StoreError> {
        let mut tx = self.driver.begin().await?;
        let now = self.now(&mut tx).await?;
        let expires = now.saturating_add(micros(request.lease_duration));
        self.reap(&mut tx, now).await?;
        let block = request.poison == PoisonPolicy::Block;
        let looped = tx
            .fetch(
                &self.queries.crash_loops,
                vec![
                    now.into(),
                    i64::from(request.crash_loop_limit).into(),
                    block.into(),
                ],
            )
            .await?;
        let crash_looped: Vec<StoredEvent> = looped
            .into_iter()
            .map(|mut r| Ok(raw_event(&mut r)?.decode().unwrap_or_else(|u| u.event)))
            .collect::<Result<_, StoreError>>()?;
        let detail = format!(
            "{} publish attempts started and none finished",
            request.crash_loop_limit
        );
        let looped_entries = entries(
            crash_looped.iter().map(|e| (e, detail.as_str())),
            AttemptKind::CrashLoop,
            request.owner.as_str(),
        );
        self.record(&mut tx, &looped_entries).await?;

        let (query, ordered) = match request.ordering {
            Ordering::PerKey => (&self.queries.claim_per_key, true),
            Ordering::Unordered => (&self.queries.claim_unordered, false),
        };
        let claims = self
            .claims
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if claims % codes::HEAL_SET_ASIDE_EVERY == 0 {
            self.heal_parked(&mut tx, now, ordered).await?;
        }
        let bound = vec![now.into(), limit(request.limit)];
        let candidates = self.candidates(&mut tx, query, bound, ordered).await?;
        let sequences: Vec<i64> = candidates.iter().map(|(s, _, _)| *s).collect();
        let mut rows = ReadRows::new();
        let read = vec![json!(sequences).to_string().into()];
        for (token, raw) in tx.fetch_events(&self.queries.read_rows, read).await? {
            rows.insert(raw.sequence, (token, raw.decode()));
        }
        // A crash suspect beyond the lease's allowance, or a row that
        // does not decode under Block, ends its key's prefix in this
        // batch.
        let (chosen, unreadable) = choose(&candidates, &rows, (ordered, block), HashSet::new());
        if !unreadable.is_empty() {
            let bad: Vec<i64> = unreadable.iter().map(|u| u.event.sequence).collect();
            let fail = vec![json!(bad).to_string().into(), block.into()];
            tx.execute(&self.queries.fail_rows, fail).await?;
            let bad_entries = entries(
                unreadable.iter().map(|u| (&u.event, u.reason.as_str())),
                AttemptKind::Unreadable,
                request.owner.as_str(),
            );
            self.record(&mut tx, &bad_entries).await?;
        }
        let mut events = Vec::new();
        if !chosen.is_empty() {
            let lease = vec![
                json!(chosen).to_string().into(),
                new_lease_id().into(),
                request.owner.as_str().into(),
                expires.into(),
            ];
            tx.execute(&self.queries.lease_rows, lease).await?;
            events = leased(&chosen, &rows, crate::row::from_micros(expires)?);
        }
        let batch = ClaimedBatch {
            events,
            crash_looped,
            unreadable,
        };
        D::commit(tx).await?;
        Ok(batch)
    }

    /// Acks `leases` (see [`outbox_core::OutboxStore::ack`]).
    pub(crate) async fn ack_now(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        let batch = leases
            .iter()
            .map(|l| json!([l.sequence, l.fencing_token.0]))
            .collect();
        let asked = leases.iter().map(|l| l.event_id);
        self.settle_json(&self.queries.ack, batch, true, asked)
            .await
    }

    /// Nacks (see [`outbox_core::OutboxStore::nack`]).
    pub(crate) async fn nack_now(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        let mut tx = self.driver.begin().await?;
        let now = self.now(&mut tx).await?;
        let batch: Vec<_> = nacks
            .iter()
            .map(|n| {
                let (status, blocks, available) = nack_state(&n.action, now);
                json!({"s": n.lease.sequence, "t": n.lease.fencing_token.0, "st": status,
                       "b": blocks, "a": available})
            })
            .collect();
        let rows = tx
            .fetch(
                &self.queries.nack,
                vec![serde_json::Value::Array(batch).to_string().into()],
            )
            .await?;
        let by_id: HashMap<EventId, &Nack> = nacks.iter().map(|n| (n.lease.event_id, n)).collect();
        let mut owners = Vec::with_capacity(rows.len());
        for r in &rows {
            owners.push((
                r.event_id("event_id")?,
                r.text("lease_owner")?,
                r.int("attempts")?,
            ));
        }
        let history: Vec<_> = owners
            .iter()
            .map(|(id, owner, attempts)| {
                let nack = by_id[id];
                HistoryEntry {
                    event_id: *id,
                    kind: codes::nack_kind(&nack.action),
                    actor: owner.as_str(),
                    error_class: Some(nack.error_class.as_str()),
                    detail: nack.error.as_str(),
                    attempts: *attempts,
                }
            })
            .collect();
        self.record(&mut tx, &history).await?;
        D::commit(tx).await?;
        Ok(report_by_ids(
            nacks.iter().map(|n| n.lease.event_id),
            &settled_ids(&rows)?,
        ))
    }

    /// Hands leases back (see [`outbox_core::OutboxStore::release`]).
    pub(crate) async fn release_now(
        &self,
        releases: &[Release],
    ) -> Result<SettleReport, StoreError> {
        let mut tx = self.driver.begin().await?;
        // Rows whose publishing had started are blamed as after a crash.
        let started: Vec<i64> = releases
            .iter()
            .filter(|r| r.attempt_started)
            .map(|r| r.lease.sequence)
            .collect();
        let mut judged: HashMap<i64, CrashVerdict> = HashMap::new();
        if !started.is_empty() {
            let held: Vec<(i64, i64, Option<u32>)> = tx
                .fetch(&self.queries.held, vec![json!(started).to_string().into()])
                .await?
                .iter()
                .map(|r| Ok((r.int("sequence")?, r.int("lease_id")?, suspect(r)?)))
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
        let rows = tx
            .fetch(
                &self.queries.release,
                vec![serde_json::Value::Array(batch).to_string().into()],
            )
            .await?;
        D::commit(tx).await?;
        Ok(report_by_ids(
            releases.iter().map(|r| r.lease.event_id),
            &settled_ids(&rows)?,
        ))
    }

    /// Records a relay's heartbeat (see [`outbox_core::OutboxStore::heartbeat`]).
    pub(crate) async fn heartbeat_now(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        let mut tx = self.driver.begin().await?;
        let now = self.now(&mut tx).await?;
        let skew_ms = (self.config.clock.now().timestamp_micros() - now) / 1000;
        let outage = beat.outage.as_ref();
        let params = vec![
            beat.relay.as_str().into(),
            now.into(),
            skew_ms.into(),
            outage.map(|o| o.destination.as_str()).into(),
            outage.map(|o| o.reason.as_str()).into(),
        ];
        tx.execute(&self.queries.heartbeat, params).await?;
        D::commit(tx).await
    }

    /// The claim's candidates for `query` with `bound`: rows marked
    /// `parked` (behind a failed row that blocks their key, or a row not
    /// yet due) are set aside in the status it names, and (where rows
    /// wait) the waiting rows of the candidates' keys come back: their
    /// key's head is due now, so they are claimable behind it in this
    /// batch. The read runs again while any row changed (at most
    /// [`codes::SET_ASIDE_ROUNDS`] reads).
    async fn candidates(
        &self,
        tx: &mut D::Tx,
        query: &str,
        bound: Vec<Param>,
        ordered: bool,
    ) -> Result<Vec<(i64, String, Option<u32>)>, StoreError> {
        let waiting_somewhere = ordered
            && !tx
                .fetch(&self.queries.any_waiting, Vec::new())
                .await?
                .is_empty();
        let mut unparked: HashSet<String> = HashSet::new();
        for round in 1.. {
            let mut candidates = Vec::new();
            let (mut parked, mut waiting) = (Vec::new(), Vec::new());
            for r in tx.fetch(query, bound.clone()).await? {
                let sequence = r.int("sequence")?;
                match i16::try_from(r.int("parked")?).unwrap_or(-1) {
                    codes::PENDING => {
                        candidates.push((sequence, r.text("partition_key")?, suspect(&r)?));
                    }
                    codes::PARKED => parked.push(sequence),
                    codes::WAITING => waiting.push(sequence),
                    codes::HELD_BACK => {}
                    other => {
                        return Err(StoreError::fatal(format!(
                            "claim read parked status {other}"
                        )));
                    }
                }
            }
            if round == codes::SET_ASIDE_ROUNDS {
                return Ok(candidates);
            }
            let mut changed = 0;
            // Back first: a row this read set aside is held by a row of
            // its key not yet due, whatever its key's first candidate.
            let fresh: HashSet<&str> = candidates
                .iter()
                .map(|c| c.1.as_str())
                .filter(|k| !unparked.contains(*k))
                .collect();
            if waiting_somewhere && !fresh.is_empty() {
                let keys = vec![json!(fresh).to_string().into()];
                changed += tx.execute(&self.queries.unpark_waiting, keys).await?;
                unparked.extend(fresh.into_iter().map(str::to_owned));
            }
            for (status, rows) in [(codes::PARKED, parked), (codes::WAITING, waiting)] {
                if !rows.is_empty() {
                    let park = vec![json!(rows).to_string().into(), i64::from(status).into()];
                    changed += tx.execute(&self.queries.park_rows, park).await?;
                }
            }
            if changed == 0 {
                return Ok(candidates);
            }
        }
        unreachable!("the rounds end at SET_ASIDE_ROUNDS")
    }

    /// Sets back rows parked behind no blocking row any more, and rows
    /// waiting behind no row of their key that is not yet due at `now`;
    /// for an unordered claim (`ordered` false), every row set aside.
    async fn heal_parked(&self, tx: &mut D::Tx, now: i64, ordered: bool) -> Result<(), StoreError> {
        if ordered {
            tx.execute(&self.queries.heal_parked, Vec::new()).await?;
            tx.execute(&self.queries.heal_waiting, vec![now.into()])
                .await?;
        } else {
            for query in &self.queries.unpark_all {
                tx.execute(query, Vec::new()).await?;
            }
        }
        Ok(())
    }

    /// Sets the parked rows of `key` back to pending (its blocking row was
    /// requeued, skipped or superseded; a claim parks them again if
    /// another one still blocks them).
    pub(super) async fn unpark_key(
        &self,
        conn: &mut (impl Exec + ?Sized),
        key: &str,
    ) -> Result<(), StoreError> {
        conn.execute(&self.queries.unpark_key, vec![key.into()])
            .await?;
        Ok(())
    }

    /// Leases that expired with rows in flight: the rows go back to
    /// pending and the crash is blamed ([`outbox_core::store::crash_culprit`]).
    async fn reap(&self, tx: &mut D::Tx, now: i64) -> Result<(), StoreError> {
        let in_flight: Vec<InFlight> = tx
            .fetch(&self.queries.in_flight, Vec::new())
            .await?
            .iter()
            .map(|r| {
                Ok(InFlight {
                    sequence: r.int("sequence")?,
                    lease_id: r.int("lease_id")?,
                    owner: r.text("lease_owner")?,
                    expires_at: r.opt_int("lease_expires_at")?.unwrap_or(0),
                    unstarted: r.bool("lease_unstarted")?,
                    suspect_span: suspect(r)?,
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
            let params = vec![serde_json::Value::Array(batch).to_string().into()];
            tx.execute(&self.queries.reap, params).await?;
        }
        for (query, rows) in [
            (&self.queries.return_rows, &reaping.returned),
            (&self.queries.mark_unstarted, &reaping.unstarted),
        ] {
            if !rows.is_empty() {
                tx.execute(query, vec![json!(rows).to_string().into()])
                    .await?;
            }
        }
        Ok(())
    }
}
