//! The MySQL/MariaDB store's protocol, once for every driver: which
//! statement runs when, with which parameters, and what its rows mean.
//!
//! Enqueue takes a row lock per partition key until commit, so writers of
//! one key take turns and a key's insert order is its commit order. Claims
//! take turns on a one-row lock table and lease rows found with `FOR UPDATE
//! SKIP LOCKED` (there is no `UPDATE … RETURNING`). Relay transactions run
//! at READ COMMITTED, so they lock only the rows they touch and never a gap
//! a producer inserts into. Every time is the database server's clock.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use outbox_core::store::{
    ClaimRequest, ClaimedBatch, CrashVerdict, Heartbeat, Lease, Nack, Release, SettleReport,
};
use outbox_core::{EventId, Ordering, PoisonPolicy, StoreError, StoredEvent, UnreadableEvent};
use serde_json::{Value as Json, json};

use super::driver::{Driver, Exec, Param, from_micros};
use super::statements::{FORGET_OWNERS_EVERY, Statements, limit, micros, params, with};
use super::{MAX_LISTED_KEYS, with_in_list, with_keys_in_flight};
use crate::blame::{blame, new_lease_id, suspect_span};
use crate::choose::{choose, leased, nack_state};
use crate::codes;
use crate::config::{Migrated, StoreConfig};
use crate::history::HistoryEntry;
use crate::settle::report_by_ids;

dialect_protocol!();

/// A decoded row with its current fencing token.
pub(super) type ReadRow = (i64, Result<StoredEvent, UnreadableEvent>);

/// A leased row a settlement found still held by its lease.
pub(super) struct Held {
    sequence: i64,
    event_id: EventId,
    owner: String,
    attempts: i64,
    lease_id: i64,
    suspect_span: Option<u32>,
}

impl<D: Driver> Protocol<D> {
    /// The store over `driver`, on `config`'s tables.
    pub fn new(driver: D, config: StoreConfig) -> Self {
        Self {
            driver,
            statements: Statements::new(config),
        }
    }

    /// Tests shift store time ([`outbox_core::StoreTime::Shifted`]): the
    /// shift is kept in the database, so every handle agrees.
    pub async fn sync_clock(&self) -> Result<(), StoreError> {
        if self.config.shift_micros().is_some() {
            let mut conn = self.driver.connect().await?;
            self.sync_clock_on(&mut conn).await?;
        }
        Ok(())
    }

    /// A transaction for the relay's own statements, at READ COMMITTED.
    pub async fn begin_relay(&self) -> Result<D::Tx, StoreError> {
        self.driver.begin(true).await
    }

    /// Creates the tables if missing. Idempotent; reports the schema
    /// version found and left. Tables of another schema version are refused
    /// with [`StoreError::Config`] naming the upgrade notes.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        let mut conn = self.driver.connect().await?;
        self.migrate_on(&mut conn).await
    }

    /// The schema version of the outbox tables: `None` if there are none,
    /// 1 for tables made before the version record existed.
    pub async fn schema_version(&self) -> Result<Option<i32>, StoreError> {
        let mut conn = self.driver.connect().await?;
        self.installed_version(&mut conn).await
    }

    /// A transaction as a producer's: at the server's default isolation.
    pub async fn begin_producer(&self) -> Result<D::Tx, StoreError> {
        self.driver.begin(false).await
    }

    /// Locks the rows of `leases` and returns those the lease still holds
    /// (token matches, in flight).
    async fn lock_leased(
        &self,
        tx: &mut D::Tx,
        leases: &[&Lease],
    ) -> Result<Vec<Held>, StoreError> {
        let tokens: HashMap<i64, i64> = leases
            .iter()
            .map(|l| (l.sequence, l.fencing_token.0))
            .collect();
        let sequences: Vec<i64> = tokens.keys().copied().collect();
        let query = with_in_list(&self.queries.lock_leased, sequences.len());
        let mut held = Vec::new();
        for r in tx.fetch(&query, params(&sequences)).await? {
            let sequence = r.int("sequence")?;
            let token = r.int("fencing_token")?;
            let status = r.int("status")?;
            if status == i64::from(codes::IN_FLIGHT) && tokens.get(&sequence) == Some(&token) {
                held.push(Held {
                    sequence,
                    event_id: r.event_id("event_id")?,
                    owner: r.text("lease_owner")?,
                    attempts: r.int("attempts")?,
                    lease_id: r.int("lease_id")?,
                    suspect_span: suspect_span(r.bool("suspect")?, r.int("suspect_span")?),
                });
            }
        }
        Ok(held)
    }

    /// Leases the next batch (see [`outbox_core::OutboxStore::claim_batch`]).
    pub(crate) async fn claim_batch_now(
        &self,
        request: &ClaimRequest,
    ) -> Result<ClaimedBatch, StoreError> {
        let mut tx = self.begin_relay().await?;
        // One claimer at a time: concurrent claims could split a key's prefix.
        let turn = tx.fetch(&self.queries.claim_lock, Vec::new()).await?;
        let flight_from = match turn.first() {
            Some(row) => row.int("flight_from")?,
            None => 0,
        };
        let now = self.now(&mut tx).await?;
        let expires = now.saturating_add(micros(request.lease_duration));
        let still = self.reap(&mut tx, now, flight_from).await?;
        let keys_in_flight = still.keys;
        let claims = self
            .claims
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if claims % FORGET_OWNERS_EVERY == 0 {
            self.forget_lease_owners(&mut tx, &still.leases).await?;
        }
        let block = request.poison == PoisonPolicy::Block;
        let crash_looped = self.fail_crash_loops(&mut tx, request, now).await?;

        let ordered = request.ordering == Ordering::PerKey;
        if claims % codes::HEAL_SET_ASIDE_EVERY == 0 {
            self.heal_parked(&mut tx, now, ordered).await?;
        }
        // Keys in flight beyond the statement's list are left out below.
        let listed = keys_in_flight.len().min(MAX_LISTED_KEYS);
        let query = if ordered {
            Cow::Owned(with_keys_in_flight(
                &self.queries.claim_candidates_per_key,
                listed,
            ))
        } else {
            Cow::Borrowed(self.queries.claim_candidates_unordered.as_str())
        };
        // `now` twice for the parked status (per key), once for the
        // claimable condition, then the keys in flight and the limit.
        let mut bound = if ordered {
            vec![now.into(), now.into(), now.into()]
        } else {
            vec![now.into()]
        };
        if ordered {
            bound.extend(
                keys_in_flight
                    .iter()
                    .take(listed)
                    .map(|k| Param::from(k.as_str())),
            );
        }
        bound.push(limit(request.limit));
        let candidates = self.candidates(&mut tx, &query, bound).await?;
        let sequences: Vec<i64> = candidates.iter().map(|(s, _, _)| *s).collect();
        let locked = self.lock_claimable(&mut tx, &sequences, now).await?;
        // A row skipped as locked (a settlement in progress), a crash
        // suspect beyond the lease's allowance, or a row that does not
        // decode under Block ends its key's prefix: nothing after it may
        // be leased in this batch.
        let rows = self.read_rows(&mut tx, &locked).await?;
        let stopped = keys_in_flight.iter().skip(listed).map(String::as_str);
        let (chosen, unreadable) = choose(&candidates, &rows, (ordered, block), stopped.collect());
        self.fail_unreadable(&mut tx, &unreadable, block, request.owner.as_str())
            .await?;
        let mut events = Vec::new();
        if !chosen.is_empty() {
            let lease_id = new_lease_id();
            let owner = vec![lease_id.into(), request.owner.as_str().into()];
            tx.execute(&self.queries.record_lease_owner, owner).await?;
            let lease = with_in_list(&self.queries.lease_rows, chosen.len());
            tx.execute(&lease, with([lease_id.into(), expires.into()], &chosen))
                .await?;
            events = leased(&chosen, &rows, from_micros(expires)?);
        }
        // The next claim's reaping read starts at the first row still
        // in flight (this claim's leases included).
        let leased_from = chosen.iter().copied().min().unwrap_or(i64::MAX);
        let floor = tx
            .fetch(
                &self.queries.flight_floor,
                vec![flight_from.min(leased_from).into()],
            )
            .await?
            .first()
            .map(|row| row.opt_int("floor"))
            .transpose()?
            .flatten()
            .unwrap_or(flight_from);
        if floor != flight_from {
            tx.execute(&self.queries.move_flight_floor, vec![floor.into()])
                .await?;
        }
        D::commit(tx).await?;
        Ok(ClaimedBatch {
            events,
            crash_looped,
            unreadable,
        })
    }

    /// Marks `leases` published where they still hold.
    pub(crate) async fn ack_now(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        let mut tx = self.begin_relay().await?;
        let report = self.ack_in(&mut tx, leases).await?;
        D::commit(tx).await?;
        Ok(report)
    }

    /// Acks `leases` in `tx` (a relay transaction; tests hold one open).
    pub async fn ack_in(
        &self,
        tx: &mut D::Tx,
        leases: &[Lease],
    ) -> Result<SettleReport, StoreError> {
        let held = self
            .lock_leased(tx, &leases.iter().collect::<Vec<_>>())
            .await?;
        let sequences: Vec<i64> = held.iter().map(|h| h.sequence).collect();
        if !sequences.is_empty() {
            let ack = with_in_list(&self.queries.ack, sequences.len());
            let now = self.now(&mut *tx).await?;
            tx.execute(&ack, with([now.into()], &sequences)).await?;
            // A published replacement lifts the block of the event it superseded.
            if !tx
                .fetch(&self.queries.superseded_blocking, Vec::new())
                .await?
                .is_empty()
            {
                let ids: Vec<String> = held.iter().map(|h| h.event_id.to_string()).collect();
                let keys = with_in_list(&self.queries.superseded_keys, ids.len());
                let keys = tx.fetch(&keys, params(&ids)).await?;
                let unblock = with_in_list(&self.queries.unblock_superseded, ids.len());
                tx.execute(&unblock, params(&ids)).await?;
                for r in keys {
                    self.unpark_key(&mut *tx, &r.text("partition_key")?).await?;
                }
            }
        }
        let settled = held.into_iter().map(|h| h.event_id).collect();
        Ok(report_by_ids(leases.iter().map(|l| l.event_id), &settled))
    }

    /// Settles failed attempts where the leases still hold.
    pub(crate) async fn nack_now(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        let mut tx = self.begin_relay().await?;
        let held = self
            .lock_leased(&mut tx, &nacks.iter().map(|n| &n.lease).collect::<Vec<_>>())
            .await?;
        let by_id: HashMap<EventId, &Nack> = nacks.iter().map(|n| (n.lease.event_id, n)).collect();
        if !held.is_empty() {
            let mut leases: Vec<i64> = held.iter().map(|h| h.lease_id).collect();
            leases.sort_unstable();
            leases.dedup();
            let owners = self.lease_owners(&mut tx, &leases).await?;
            let now = self.now(&mut tx).await?;
            let batch: Vec<_> = held
                .iter()
                .map(|h| {
                    let (status, blocks, available) = nack_state(&by_id[&h.event_id].action, now);
                    json!({"s": h.sequence, "st": status, "b": blocks, "a": available})
                })
                .collect();
            let sequences: Vec<i64> = held.iter().map(|h| h.sequence).collect();
            let nack = with_in_list(&self.queries.nack, sequences.len());
            let batch = Json::Array(batch).to_string();
            tx.execute(&nack, with([batch.into()], &sequences)).await?;
            let entries: Vec<_> = held
                .iter()
                .map(|h| {
                    let nack = by_id[&h.event_id];
                    HistoryEntry {
                        event_id: h.event_id,
                        kind: codes::nack_kind(&nack.action),
                        actor: owners.get(&h.lease_id).unwrap_or(&h.owner).as_str(),
                        error_class: Some(nack.error_class.as_str()),
                        detail: nack.error.as_str(),
                        attempts: h.attempts + 1,
                    }
                })
                .collect();
            self.record(&mut tx, &entries).await?;
        }
        D::commit(tx).await?;
        let settled = held.into_iter().map(|h| h.event_id).collect();
        Ok(report_by_ids(
            nacks.iter().map(|n| n.lease.event_id),
            &settled,
        ))
    }

    /// Returns leased rows unpublished where the leases still hold.
    pub(crate) async fn release_now(
        &self,
        releases: &[Release],
    ) -> Result<SettleReport, StoreError> {
        let mut tx = self.begin_relay().await?;
        let held = self
            .lock_leased(
                &mut tx,
                &releases.iter().map(|r| &r.lease).collect::<Vec<_>>(),
            )
            .await?;
        let started: HashMap<i64, bool> = releases
            .iter()
            .map(|r| (r.lease.sequence, r.attempt_started))
            .collect();
        if !held.is_empty() {
            // Rows whose publishing had started are judged as after a crash.
            let judged: HashMap<i64, CrashVerdict> = blame(
                &held
                    .iter()
                    .filter(|h| started[&h.sequence])
                    .map(|h| (h.sequence, h.lease_id, h.suspect_span))
                    .collect::<Vec<_>>(),
            )
            .into_iter()
            .map(|v| (v.sequence, v))
            .collect();
            let batch: Vec<_> = held
                .iter()
                .map(|h| {
                    let verdict = judged.get(&h.sequence);
                    json!([
                        h.sequence,
                        started[&h.sequence],
                        i64::from(verdict.is_some_and(|v| v.blamed)),
                        verdict.map_or(0, |v| v.suspect_span)
                    ])
                })
                .collect();
            let sequences: Vec<i64> = held.iter().map(|h| h.sequence).collect();
            let release = with_in_list(&self.queries.release, sequences.len());
            let batch = Json::Array(batch).to_string();
            tx.execute(&release, with([batch.into()], &sequences))
                .await?;
        }
        D::commit(tx).await?;
        let settled = held.into_iter().map(|h| h.event_id).collect();
        Ok(report_by_ids(
            releases.iter().map(|r| r.lease.event_id),
            &settled,
        ))
    }

    /// Records that the relay is alive, with its clock's skew from the
    /// store's and the publisher outage it is paused for, if any.
    pub(crate) async fn heartbeat_now(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        let mut conn = self.driver.connect().await?;
        let now = self.now(&mut conn).await?;
        let skew_ms = (self.config.clock.now().timestamp_micros() - now) / 1000;
        let outage = beat.outage.as_ref();
        conn.execute(
            &self.queries.heartbeat,
            vec![
                beat.relay.as_str().into(),
                now.into(),
                skew_ms.into(),
                outage.map(|_| now).into(),
                outage.map(|o| o.destination.clone()).into(),
                outage.map(|o| o.reason.clone()).into(),
            ],
        )
        .await?;
        Ok(())
    }

    /// The inbox purge's own work (`inbox_purge` wraps it): up to `most`
    /// claims older than `age`.
    pub(crate) async fn inbox_gc(&self, age: Duration, most: usize) -> Result<u64, StoreError> {
        let mut conn = self.driver.connect().await?;
        let cutoff = self.now(&mut conn).await?.saturating_sub(micros(age));
        let params = vec![cutoff.into(), limit(most)];
        conn.execute(&self.queries.inbox_purge, params).await
    }
}
