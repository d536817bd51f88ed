//! Rows set aside by the per-key claim that found them held back, so
//! later claims read past none of them: parked behind a failed row that
//! blocks their key (status 4), or waiting behind a row of their key not
//! yet due (status 5). An operator's requeue or skip or a published
//! replacement sets parked rows back; a claim that finds a key's head due
//! sets its waiting rows back; claims now and then set back any whose
//! block or wait ended by other means.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use outbox_core::StoreError;

use super::driver::{Driver, Exec, Param};
use super::protocol::Protocol;
use super::statements::{limit, params, with};
use super::{with_in_list, with_key_ranges};
use crate::blame::suspect_span;
use crate::codes::{self, SET_ASIDE_ROUNDS};

/// At most this many parked rows are set back by one claim's look.
const HEAL_MOST: usize = 10_000;

/// A claim's candidate rows: `(sequence, key, suspect span)`.
pub(super) type Candidates = Vec<(i64, String, Option<u32>)>;

impl<D: Driver> Protocol<D> {
    /// Parks `held` (rows a claim found behind a blocking row, as
    /// `(sequence, key)`) where a blocking row, not superseded, still comes
    /// first: read with a share lock, so an operator lifting it either
    /// finished first or unparks these after this claim commits. Rows
    /// behind a superseded blocking row stay pending (its replacement may
    /// be among them). Returns how many were parked.
    async fn park(&self, tx: &mut D::Tx, held: &[(i64, String)]) -> Result<u64, StoreError> {
        if held.is_empty() {
            return Ok(0);
        }
        let mut keys: Vec<&str> = held.iter().map(|(_, k)| k.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        let query = with_in_list(&self.queries.blockers_of, keys.len());
        let mut first = HashMap::new();
        for r in tx.fetch(&query, params(&keys)).await? {
            first.insert(r.text("partition_key")?, r.int("first")?);
        }
        let parked: Vec<i64> = held
            .iter()
            .filter(|(sequence, key)| first.get(key).is_some_and(|f| f < sequence))
            .map(|(sequence, _)| *sequence)
            .collect();
        if parked.is_empty() {
            return Ok(0);
        }
        self.set_aside(tx, &parked, codes::PARKED).await
    }

    /// Sets `sequences` aside in `status`, where still pending.
    async fn set_aside(
        &self,
        tx: &mut D::Tx,
        sequences: &[i64],
        status: i16,
    ) -> Result<u64, StoreError> {
        if sequences.is_empty() {
            return Ok(0);
        }
        let query = with_in_list(&self.queries.park_rows, sequences.len());
        tx.execute(&query, with([i64::from(status).into()], sequences))
            .await
    }

    /// Sets `waiting` (rows behind a row of their key not yet due, as
    /// `(sequence, key)`) aside, and notes their keys.
    async fn set_waiting(
        &self,
        tx: &mut D::Tx,
        waiting: &[(i64, String)],
    ) -> Result<u64, StoreError> {
        if waiting.is_empty() {
            return Ok(0);
        }
        let keys: BTreeSet<&str> = waiting.iter().map(|(_, k)| k.as_str()).collect();
        let values = vec!["(?)"; keys.len()].join(", ");
        let note = self.queries.note_waiting.replace("{values}", &values);
        tx.execute(&note, params(&keys.into_iter().collect::<Vec<_>>()))
            .await?;
        let sequences: Vec<i64> = waiting.iter().map(|(s, _)| *s).collect();
        self.set_aside(tx, &sequences, codes::WAITING).await
    }

    /// Sets back the rows waiting behind `keys` (each key's rows after
    /// its sequence: its first candidate, due now, so they are claimable
    /// behind it in this batch) and forgets the keys. Returns how many
    /// rows came back.
    async fn unpark_waiting(
        &self,
        tx: &mut D::Tx,
        keys: &BTreeMap<String, i64>,
    ) -> Result<u64, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let query = with_key_ranges(&self.queries.unpark_waiting, keys.len());
        let mut bound = Vec::with_capacity(keys.len() * 2);
        for (key, sequence) in keys {
            bound.extend([Param::from(key.as_str()), (*sequence).into()]);
        }
        let back = tx.execute(&query, bound).await?;
        let forget = with_in_list(&self.queries.forget_waiting, keys.len());
        tx.execute(&forget, params(&keys.keys().cloned().collect::<Vec<_>>()))
            .await?;
        Ok(back)
    }

    /// Sets the parked rows of `key` back to pending (its blocking row was
    /// requeued, skipped or replaced; a claim parks them again if another
    /// one still blocks them).
    pub(super) async fn unpark_key(
        &self,
        conn: &mut (impl Exec + ?Sized),
        key: &str,
    ) -> Result<(), StoreError> {
        conn.execute(&self.queries.unpark_key, vec![Param::from(key)])
            .await?;
        Ok(())
    }

    /// Sets back rows parked behind no blocking row any more, and rows
    /// waiting behind no row of their key that is not yet due at `now`;
    /// for an unordered claim (`ordered` false), every row set aside.
    pub(super) async fn heal_parked(
        &self,
        tx: &mut D::Tx,
        now: i64,
        ordered: bool,
    ) -> Result<(), StoreError> {
        let (parked, waiting) = if ordered {
            let parked = tx
                .fetch(&self.queries.parked_unblocked, vec![limit(HEAL_MOST)])
                .await?;
            let waiting = vec![now.into(), limit(HEAL_MOST)];
            (
                parked,
                tx.fetch(&self.queries.waiting_unheld, waiting).await?,
            )
        } else {
            let most = vec![limit(HEAL_MOST)];
            (
                tx.fetch(&self.queries.set_aside_rows, most).await?,
                Vec::new(),
            )
        };
        let sequences = parked
            .iter()
            .chain(&waiting)
            .map(|r| r.int("sequence"))
            .collect::<Result<Vec<_>, _>>()?;
        if !sequences.is_empty() {
            let query = with_in_list(&self.queries.unpark_rows, sequences.len());
            tx.execute(&query, params(&sequences)).await?;
        }
        Ok(())
    }

    /// The claim's candidates for `query` with `bound` (its limit last):
    /// rows marked `parked` are set aside, and the waiting rows of the
    /// candidates' keys come back (once per key and claim); the read runs
    /// again while any row changed (at most [`SET_ASIDE_ROUNDS`] reads).
    pub(super) async fn candidates(
        &self,
        tx: &mut D::Tx,
        query: &str,
        bound: Vec<Param>,
    ) -> Result<Candidates, StoreError> {
        let mut unparked = HashSet::new();
        for round in 1.. {
            let mut candidates = Vec::new();
            let mut held = Vec::new();
            let mut waiting = Vec::new();
            let mut back = BTreeMap::new();
            for r in tx.fetch(query, bound.clone()).await? {
                let sequence = r.int("sequence")?;
                let key = r.text("partition_key")?;
                match i16::try_from(r.int("parked")?).unwrap_or(-1) {
                    codes::PENDING => {
                        if r.bool("key_waits")? && !unparked.contains(&key) {
                            back.entry(key.clone()).or_insert(sequence);
                        }
                        let span = suspect_span(r.bool("suspect")?, r.int("suspect_span")?);
                        candidates.push((sequence, key, span));
                    }
                    codes::PARKED => held.push((sequence, key)),
                    codes::WAITING => waiting.push((sequence, key)),
                    other => {
                        return Err(StoreError::fatal(format!(
                            "claim read parked status {other}"
                        )));
                    }
                }
            }
            if round == SET_ASIDE_ROUNDS {
                return Ok(candidates);
            }
            // Back first: a row this read set aside is held by a row of
            // its key not yet due, whatever its key's first candidate.
            let mut changed = self.unpark_waiting(tx, &back).await?;
            unparked.extend(back.into_keys());
            changed += self.park(tx, &held).await? + self.set_waiting(tx, &waiting).await?;
            if changed == 0 {
                return Ok(candidates);
            }
        }
        unreachable!("the rounds end at SET_ASIDE_ROUNDS")
    }
}
