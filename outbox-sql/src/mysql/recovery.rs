//! How the MySQL/MariaDB claim recovers and reads: expired leases reaped
//! and their crash blamed, crash loops and unreadable rows failed, the
//! claimable rows locked and read.

use std::collections::{BTreeSet, HashMap, HashSet};

use outbox_core::store::{AttemptKind, ClaimRequest, CrashVerdict};
use outbox_core::{PoisonPolicy, StoreError, StoredEvent, UnreadableEvent};
use serde_json::{Value as Json, json};

use super::driver::{Driver, Exec, Param, Row};
use super::protocol::{Protocol, ReadRow};
use super::statements::{params, raw_event, with};
use super::with_in_list;
use crate::blame::{InFlight, reap, suspect_span};
use crate::history::HistoryEntry;

/// What a claim's reaping left in flight.
pub(super) struct StillInFlight {
    /// Keys with a row in flight.
    pub keys: BTreeSet<String>,
    /// Leases with a row in flight.
    pub leases: BTreeSet<i64>,
}

impl<D: Driver> Protocol<D> {
    /// Leases that expired with rows in flight: the rows go back to
    /// pending and the crash is blamed ([`outbox_core::store::crash_culprit`]).
    /// Returns what is still in flight: its keys, which a per-key claim
    /// leaves alone, and its leases, whose owners are kept.
    pub(super) async fn reap(
        &self,
        tx: &mut D::Tx,
        now: i64,
        flight_from: i64,
    ) -> Result<StillInFlight, StoreError> {
        // Read without locking (a locking scan of the status index
        // deadlocks with settlements), then lock the expired rows by
        // primary key, skipping any a settlement holds right now.
        let (in_flight, keys): (Vec<InFlight>, Vec<String>) = tx
            .fetch(&self.queries.in_flight, vec![flight_from.into()])
            .await?
            .iter()
            .map(|r| {
                let row = InFlight {
                    sequence: r.int("sequence")?,
                    lease_id: r.int("lease_id")?,
                    owner: r.text("lease_owner")?,
                    expires_at: r.opt_int("lease_expires_at")?.unwrap_or(0),
                    unstarted: r.bool("lease_unstarted")?,
                    suspect_span: suspect_span(r.bool("suspect")?, r.int("suspect_span")?),
                };
                Ok((row, r.text("partition_key")?))
            })
            .collect::<Result<_, StoreError>>()?;
        let reaping = reap(&in_flight, now);
        let expired: Vec<i64> = reaping
            .blamed
            .iter()
            .map(|v| v.sequence)
            .chain(reaping.returned.iter().copied())
            .collect();
        if expired.is_empty() {
            return Ok(StillInFlight {
                leases: in_flight.iter().map(|row| row.lease_id).collect(),
                keys: keys.into_iter().collect(),
            });
        }
        let lock = with_in_list(&self.queries.lock_expired, expired.len());
        let locked: HashSet<i64> = tx
            .fetch(&lock, with([now.into()], &expired))
            .await?
            .iter()
            .map(|r| r.int("sequence"))
            .collect::<Result<_, _>>()?;
        let blamed: Vec<CrashVerdict> = reaping
            .blamed
            .into_iter()
            .filter(|v| locked.contains(&v.sequence))
            .collect();
        if !blamed.is_empty() {
            let sequences: Vec<i64> = blamed.iter().map(|v| v.sequence).collect();
            let update = with_in_list(&self.queries.reap, sequences.len());
            let batch = Json::Array(
                blamed
                    .iter()
                    .map(|v| json!([v.sequence, i64::from(v.blamed), v.suspect_span]))
                    .collect(),
            )
            .to_string();
            tx.execute(&update, with([batch.into()], &sequences))
                .await?;
        }
        let returned: Vec<i64> = reaping
            .returned
            .into_iter()
            .filter(|s| locked.contains(s))
            .collect();
        for (query, rows) in [
            (&self.queries.return_rows, returned),
            (&self.queries.mark_unstarted, reaping.unstarted),
        ] {
            if !rows.is_empty() {
                let update = with_in_list(query, rows.len());
                tx.execute(&update, params(&rows)).await?;
            }
        }
        // Every locked expired row went back to pending; the rest stay in
        // flight (a settlement holds them right now).
        let (rows, keys): (Vec<&InFlight>, BTreeSet<String>) = in_flight
            .iter()
            .zip(keys)
            .filter(|(row, _)| !locked.contains(&row.sequence))
            .unzip();
        Ok(StillInFlight {
            leases: rows.iter().map(|row| row.lease_id).collect(),
            keys,
        })
    }

    /// Removes the owner records of leases other than `live` (the leases
    /// with a row in flight): run under the claim lock, so no lease is
    /// recorded meanwhile, and only claims write these rows.
    pub(super) async fn forget_lease_owners(
        &self,
        tx: &mut D::Tx,
        live: &BTreeSet<i64>,
    ) -> Result<(), StoreError> {
        if live.is_empty() {
            tx.execute(&self.queries.forget_every_lease_owner, Vec::new())
                .await?;
        } else {
            let live: Vec<i64> = live.iter().copied().collect();
            let forget = with_in_list(&self.queries.forget_lease_owners, live.len());
            tx.execute(&forget, params(&live)).await?;
        }
        Ok(())
    }

    /// The owners of `leases` (their records; leases of earlier releases
    /// have none and keep the owner their rows name).
    pub(super) async fn lease_owners(
        &self,
        tx: &mut D::Tx,
        leases: &[i64],
    ) -> Result<HashMap<i64, String>, StoreError> {
        fetch_listed(tx, &self.queries.lease_owners_of, [], leases)
            .await?
            .iter()
            .map(|r| Ok((r.int("lease_id")?, r.text("owner")?)))
            .collect()
    }

    /// Rows blamed for `crash_loop_limit` crashes, at the head of their key,
    /// end failed.
    pub(super) async fn fail_crash_loops(
        &self,
        tx: &mut D::Tx,
        request: &ClaimRequest,
        now: i64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let looped: Vec<i64> = tx
            .fetch(
                &self.queries.crash_loop_candidates,
                vec![i64::from(request.crash_loop_limit).into(), now.into()],
            )
            .await?
            .iter()
            .map(|r| r.int("sequence"))
            .collect::<Result<_, _>>()?;
        let looped = self.lock_claimable(tx, &looped, now).await?;
        if looped.is_empty() {
            return Ok(Vec::new());
        }
        let fail = with_in_list(&self.queries.fail_rows, looped.len());
        let block = request.poison == PoisonPolicy::Block;
        tx.execute(&fail, with([block.into()], &looped)).await?;
        let events: Vec<_> = self
            .read_rows(tx, &looped)
            .await?
            .into_values()
            .map(|(_, decoded)| decoded.unwrap_or_else(|u| u.event))
            .collect();
        let detail = format!(
            "{} publish attempts started and none finished",
            request.crash_loop_limit
        );
        let entries: Vec<_> = events
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
        self.record(tx, &entries).await?;
        Ok(events)
    }

    /// Fails rows that do not decode, each on its own (history kind
    /// `Unreadable`).
    pub(super) async fn fail_unreadable(
        &self,
        tx: &mut D::Tx,
        unreadable: &[UnreadableEvent],
        block: bool,
        actor: &str,
    ) -> Result<(), StoreError> {
        if unreadable.is_empty() {
            return Ok(());
        }
        let sequences: Vec<i64> = unreadable.iter().map(|u| u.event.sequence).collect();
        let fail = with_in_list(&self.queries.fail_rows, sequences.len());
        tx.execute(&fail, with([block.into()], &sequences)).await?;
        let entries: Vec<_> = unreadable
            .iter()
            .map(|u| HistoryEntry {
                event_id: u.event.event_id,
                kind: AttemptKind::Unreadable,
                actor,
                error_class: None,
                detail: u.reason.as_str(),
                attempts: i64::from(u.event.attempts),
            })
            .collect();
        self.record(tx, &entries).await
    }

    /// Locks those of `sequences` that are still claimable, skipping rows a
    /// settlement holds. Returns the locked sequences.
    pub(super) async fn lock_claimable(
        &self,
        tx: &mut D::Tx,
        sequences: &[i64],
        now: i64,
    ) -> Result<Vec<i64>, StoreError> {
        fetch_listed(tx, &self.queries.lock_rows, [now.into()], sequences)
            .await?
            .iter()
            .map(|r| r.int("sequence"))
            .collect()
    }

    /// The rows, each with its current fencing token, decoded one by one.
    pub(super) async fn read_rows(
        &self,
        tx: &mut D::Tx,
        sequences: &[i64],
    ) -> Result<HashMap<i64, ReadRow>, StoreError> {
        fetch_listed(tx, &self.queries.read_rows, [], sequences)
            .await?
            .into_iter()
            .map(|mut r| {
                let token = r.int("fencing_token")?;
                let raw = raw_event(&mut r)?;
                Ok((raw.sequence, (token, raw.decode())))
            })
            .collect()
    }
}

/// The rows of `query` with its `IN (…)` list of `ids`, after the `head`
/// parameters; no statement (and no rows) for no ids.
async fn fetch_listed<const N: usize>(
    tx: &mut (impl Exec + ?Sized),
    query: &str,
    head: [Param; N],
    ids: &[i64],
) -> Result<Vec<Row>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    tx.fetch(&with_in_list(query, ids.len()), with(head, ids))
        .await
}
