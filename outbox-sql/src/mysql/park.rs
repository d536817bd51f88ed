//! Rows parked behind a failed row that blocks their key (status 4): a
//! per-key claim sets aside the rows it finds held back by one, so later
//! claims read past none of them; an operator's requeue, skip or a
//! published replacement sets them back, and claims now and then set back
//! any whose block was lifted by other means.

use std::collections::HashMap;

use outbox_core::StoreError;

use super::driver::{Driver, Exec, Param};
use super::protocol::Protocol;
use super::statements::{limit, params};
use super::with_in_list;

/// How often (in claims of one store) a claim looks for parked rows
/// whose block is gone (lifted by an earlier release or by hand): the
/// read steps over every parked row, so most claims skip it.
pub const HEAL_PARKED_EVERY: u64 = 64;

/// At most this many parked rows are set back by one claim's look.
const HEAL_MOST: usize = 10_000;

/// At most this many times one claim parks what it found and reads again
/// (each time it parks up to a batch of rows).
pub const PARK_ROUNDS: usize = 16;

/// A claim's candidate rows: `(sequence, key, suspect span)`.
pub(super) type Candidates = Vec<(i64, String, Option<u32>)>;

impl<D: Driver> Protocol<D> {
    /// Parks `held` (rows a claim found behind a blocking row, as
    /// `(sequence, key)`) where a blocking row, not superseded, still comes
    /// first: read with a share lock, so an operator lifting it either
    /// finished first or unparks these after this claim commits. Rows
    /// behind a superseded blocking row stay pending (its replacement may
    /// be among them). Returns how many were parked.
    pub(super) async fn park(
        &self,
        tx: &mut D::Tx,
        held: &[(i64, String)],
    ) -> Result<u64, StoreError> {
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
        let query = with_in_list(&self.queries.park_rows, parked.len());
        tx.execute(&query, params(&parked)).await
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

    /// Sets back rows parked behind no blocking row any more.
    pub(super) async fn heal_parked(&self, tx: &mut D::Tx) -> Result<(), StoreError> {
        let rows = tx
            .fetch(&self.queries.parked_unblocked, vec![limit(HEAL_MOST)])
            .await?;
        let sequences = rows
            .iter()
            .map(|r| r.int("sequence"))
            .collect::<Result<Vec<_>, _>>()?;
        if !sequences.is_empty() {
            let query = with_in_list(&self.queries.unpark_rows, sequences.len());
            tx.execute(&query, params(&sequences)).await?;
        }
        Ok(())
    }

    /// The claim's candidates for `query` with `bound` (its limit last):
    /// rows marked `parked` are parked and the read runs again, until a
    /// read parks none (or [`PARK_ROUNDS`] reads).
    pub(super) async fn candidates(
        &self,
        tx: &mut D::Tx,
        query: &str,
        bound: Vec<Param>,
    ) -> Result<Candidates, StoreError> {
        for round in 1.. {
            let mut candidates = Vec::new();
            let mut held = Vec::new();
            for r in tx.fetch(query, bound.clone()).await? {
                let sequence = r.int("sequence")?;
                let key = r.text("partition_key")?;
                if r.bool("parked")? {
                    held.push((sequence, key));
                } else {
                    let span =
                        crate::blame::suspect_span(r.bool("suspect")?, r.int("suspect_span")?);
                    candidates.push((sequence, key, span));
                }
            }
            if held.is_empty() || round == PARK_ROUNDS || self.park(tx, &held).await? == 0 {
                return Ok(candidates);
            }
        }
        unreachable!("the rounds end at PARK_ROUNDS")
    }
}
