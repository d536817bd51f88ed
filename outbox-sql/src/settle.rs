//! What every SQL adapter does with the rows a claim or a settlement
//! returns, whatever the driver: a claim's rows sorted into the batch, the
//! rows to hand back and the rows that do not decode; a settlement's
//! returned sequences turned into a report; a nack's parameters.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use outbox_core::store::{
    ClaimedBatch, ClaimedEvent, FencingToken, Lease, Nack, NackAction, Release, SettleReport,
};
use outbox_core::{EventId, RawEvent, StoreError, UnreadableEvent};

use crate::codes;

/// One row a claim statement returned, mapped by the adapter.
#[derive(Clone, Debug)]
pub struct ClaimRow {
    /// The event's columns, not yet decoded.
    pub raw: RawEvent,
    /// The row was claimed too often without an outcome: it goes to
    /// `failed` (the statement already moved it), not to the relay.
    pub crash_looped: bool,
    /// The lease's fencing token (none on a crash-looped row).
    pub fencing_token: Option<i64>,
    /// When the lease ends, on store time (none on a crash-looped row).
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// A claim's rows, sorted.
#[derive(Debug, Default)]
pub struct SortedClaim {
    /// What the relay publishes (and the crash-looped rows it reports).
    pub batch: ClaimedBatch,
    /// Leased rows to hand back at once, unstarted: under `Block`, the
    /// rows that follow an unreadable row of their key.
    pub held_back: Vec<Release>,
    /// Rows that do not decode, each to fail on its own (history kind
    /// `Unreadable`), with the token of the lease holding them.
    pub unreadable: Vec<(UnreadableEvent, FencingToken)>,
}

/// Sorts a claim's rows. Under `Block` (`block`), a row that does not decode
/// parks its key, so the rows of that key after it in this batch go back.
/// Fails only on a leased row without its lease (a statement out of step
/// with this crate).
pub fn sort_claim(rows: Vec<ClaimRow>, block: bool) -> Result<SortedClaim, StoreError> {
    let mut sorted = SortedClaim::default();
    let mut blocked_keys: HashSet<String> = HashSet::new();
    for row in rows {
        if row.crash_looped {
            sorted
                .batch
                .crash_looped
                .push(row.raw.decode().unwrap_or_else(|u| u.event));
            continue;
        }
        let (Some(token), Some(lease_expires_at)) = (row.fencing_token, row.lease_expires_at)
        else {
            return Err(StoreError::fatal(format!(
                "the claim returned row {} without its lease",
                row.raw.sequence
            )));
        };
        let token = FencingToken(token);
        if blocked_keys.contains(&row.raw.partition_key) {
            sorted.held_back.push(Release {
                lease: Lease {
                    sequence: row.raw.sequence,
                    event_id: row.raw.event_id,
                    fencing_token: token,
                    lease_expires_at,
                },
                attempt_started: false,
            });
            continue;
        }
        match row.raw.decode() {
            Ok(event) => {
                let lease = Lease {
                    sequence: event.sequence,
                    event_id: event.event_id,
                    fencing_token: token,
                    lease_expires_at,
                };
                sorted.batch.events.push(ClaimedEvent { event, lease });
            }
            Err(bad) => {
                if block {
                    blocked_keys.insert(bad.event.partition_key.clone());
                }
                sorted.unreadable.push((bad, token));
            }
        }
    }
    Ok(sorted)
}

/// What a settlement did, by event id: `settled` were settled, the rest of
/// `asked` was fenced off.
pub fn report_by_ids(
    asked: impl Iterator<Item = EventId>,
    settled: &HashSet<EventId>,
) -> SettleReport {
    SettleReport {
        applied: settled.len(),
        fenced: asked.filter(|id| !settled.contains(id)).collect(),
    }
}

/// What a settlement did: the sequences it returned were settled, the rest
/// of `asked` (sequence, event id) was fenced off.
pub fn settled_report(
    settled: impl IntoIterator<Item = i64>,
    asked: impl Iterator<Item = (i64, EventId)>,
) -> SettleReport {
    let settled: HashSet<i64> = settled.into_iter().collect();
    let fenced = asked
        .filter(|(sequence, _)| !settled.contains(sequence))
        .map(|(_, id)| id)
        .collect();
    SettleReport {
        applied: settled.len(),
        fenced,
    }
}

/// A nack batch as the column arrays the nack statement takes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NackColumns {
    /// Row sequences.
    pub sequences: Vec<i64>,
    /// Their leases' fencing tokens.
    pub tokens: Vec<i64>,
    /// Retry after this many milliseconds, or `None`: fail for good.
    pub retry_after_ms: Vec<Option<i64>>,
    /// A failure that parks its key (`Block`).
    pub block_key: Vec<bool>,
    /// History kind codes.
    pub kinds: Vec<&'static str>,
    /// Publish error class codes.
    pub classes: Vec<&'static str>,
    /// The errors.
    pub errors: Vec<String>,
}

impl NackColumns {
    /// The columns of `nacks`, in order.
    pub fn of(nacks: &[Nack]) -> Self {
        let mut columns = Self::default();
        for nack in nacks {
            columns.sequences.push(nack.lease.sequence);
            columns.tokens.push(nack.lease.fencing_token.0);
            match &nack.action {
                NackAction::Retry { after } => {
                    columns
                        .retry_after_ms
                        .push(Some(i64::try_from(after.as_millis()).unwrap_or(i64::MAX)));
                    columns.block_key.push(false);
                }
                NackAction::Fail { block_key, .. } => {
                    columns.retry_after_ms.push(None);
                    columns.block_key.push(*block_key);
                }
            }
            columns
                .kinds
                .push(codes::attempt_kind_code(codes::nack_kind(&nack.action)));
            columns.classes.push(nack.error_class.as_str());
            columns.errors.push(nack.error.clone());
        }
        columns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(sequence: i64, key: &str, payload: &str) -> RawEvent {
        RawEvent {
            sequence,
            event_id: EventId::random(),
            aggregate_type: "invoice".into(),
            aggregate_id: key.into(),
            event_type: "invoice.paid".into(),
            partition_key: key.into(),
            payload: payload.into(),
            payload_version: 1,
            headers: "{}".into(),
            created_at: Utc::now(),
            available_at: Utc::now(),
            attempts: 0,
        }
    }

    fn row(sequence: i64, key: &str, payload: &str) -> ClaimRow {
        ClaimRow {
            raw: raw(sequence, key, payload),
            crash_looped: false,
            fencing_token: Some(sequence * 10),
            lease_expires_at: Some(Utc::now()),
        }
    }

    #[test]
    fn under_block_an_unreadable_row_sends_its_keys_later_rows_back() {
        let rows = vec![
            row(1, "a", "{}"),
            row(2, "b", "not json"),
            row(3, "b", "{}"),
            row(4, "a", "{}"),
        ];
        let sorted = sort_claim(rows.clone(), true).unwrap();
        let published: Vec<i64> = sorted
            .batch
            .events
            .iter()
            .map(|e| e.event.sequence)
            .collect();
        assert_eq!(published, [1, 4]);
        assert_eq!(sorted.unreadable.len(), 1);
        assert_eq!(sorted.unreadable[0].1, FencingToken(20));
        assert_eq!(sorted.held_back.len(), 1);
        assert_eq!(sorted.held_back[0].lease.sequence, 3);
        assert!(!sorted.held_back[0].attempt_started);

        let skipping = sort_claim(rows, false).unwrap();
        assert_eq!(
            skipping.batch.events.len(),
            3,
            "under Skip the key flows on"
        );
        assert!(skipping.held_back.is_empty());
    }

    #[test]
    fn crash_looped_rows_are_reported_not_published() {
        let mut looped = row(1, "a", "{}");
        looped.crash_looped = true;
        (looped.fencing_token, looped.lease_expires_at) = (None, None);
        let sorted = sort_claim(vec![looped, row(2, "b", "{}")], false).unwrap();
        assert_eq!(sorted.batch.crash_looped.len(), 1);
        assert_eq!(sorted.batch.events.len(), 1);
        let mut leaseless = row(3, "c", "{}");
        leaseless.fencing_token = None;
        assert!(sort_claim(vec![leaseless], false).is_err());
    }

    #[test]
    fn a_settlement_reports_what_it_did_not_return_as_fenced() {
        let (a, b) = (EventId::random(), EventId::random());
        let report = settled_report([1], [(1, a), (2, b)].into_iter());
        assert_eq!(report.applied, 1);
        assert_eq!(report.fenced, vec![b]);
    }
}
