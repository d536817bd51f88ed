//! Every SQLite statement, built once from validated table names. Batches
//! travel as one JSON array parameter read with `json_each`, so each
//! settlement is one statement whatever the batch size.

use crate::admin_queries::{AdminQueries, EVENT_COLUMNS};
use crate::config::TableNames;

/// Pending and due (`?1` is now). Expired leases are reaped before any
/// claim looks for candidates.
const CLAIMABLE: &str = "(c.status = 0 AND c.available_at <= ?1)";

/// Every statement, built once from validated names. Each field is the
/// statement of the store operation it is named after; its parameters and
/// result columns are what the adapter binds and maps (see the store that
/// uses it).
#[allow(missing_docs)]
pub struct Queries {
    pub admin: AdminQueries,
    pub now: String,
    pub sync_clock: String,
    pub enqueue: String,
    pub in_flight: String,
    pub reap: String,
    pub return_rows: String,
    pub mark_unstarted: String,
    pub crash_loops: String,
    pub claim_per_key: String,
    pub claim_unordered: String,
    pub park_rows: String,
    pub any_waiting: String,
    pub unpark_waiting: String,
    pub heal_waiting: String,
    pub unpark_all: [String; 2],
    pub unpark_key: String,
    pub heal_parked: String,
    pub read_rows: String,
    pub lease_rows: String,
    pub fail_rows: String,
    pub held: String,
    pub ack: String,
    pub nack: String,
    pub release: String,
    pub record_many: String,
    pub heartbeat: String,
    pub supersede_lock: String,
    pub supersede_insert: String,
    pub supersede_mark: String,
    pub purge_history: String,
    pub purge: String,
    pub inbox_claim: String,
    pub inbox_purge: String,
}

impl Queries {
    /// The statements for these table names.
    pub fn new(names: &TableNames) -> Self {
        let [events, attempts, inbox, relays] = names.main_four();
        let control = names.table("control");
        let earlier =
            "(COALESCE(p.ord, p.sequence), p.sequence) < (COALESCE(c.ord, c.sequence), c.sequence)";
        // Candidates in claim order: pending and due, and (per key) no
        // earlier row of the key holds it back (blocking, in flight, or not
        // yet due). One probe per kind, each on a partial index holding
        // only the key's rows of that kind: one probe over all kinds reads
        // the key's whole backlog for every candidate, quadratic in a key's
        // backlog. A row held back by a failed blocking row, or by a row
        // not yet due, is returned too, marked `parked` with the status the
        // claim sets it aside in (4 or 5), so no later claim steps over it
        // again (10,000 blocked keys cost every claim 10,000 rows probed
        // while they stayed in the live index). A claim that finds a key's
        // head due sets its waiting rows back first (`unpark_waiting`).
        // The parked status per key, from one probe of the key's blocking
        // rows: 4 behind a failed one; 9 (held, not set aside) behind one
        // that is neither failed nor claimable; else 5 behind a row not
        // yet due; else 0. The blocking probe names its index: SQLite
        // chose the key's live rows instead, every live row of the key
        // read for each candidate (a claim's read 1.9 ms, against 1.3).
        let blocking = format!("{}_events_key_blocking", names.prefix());
        let (parked_mark, held_mark, waiting_mark, pending_mark) = (
            crate::codes::PARKED,
            crate::codes::HELD_BACK,
            crate::codes::WAITING,
            crate::codes::PENDING,
        );
        let parked = format!(
            "CASE (SELECT MAX(p.status = 3) FROM {events} p INDEXED BY {blocking}
                   WHERE p.partition_key = c.partition_key AND p.blocks_key
                     AND NOT (p.status = 0 AND p.available_at <= ?1) AND {earlier})
                 WHEN 1 THEN {parked_mark}
                 WHEN 0 THEN {held_mark}
                 ELSE CASE WHEN EXISTS (SELECT 1 FROM {events} p
                                        WHERE p.partition_key = c.partition_key AND p.status = 0
                                          AND p.available_at > ?1 AND {earlier}) THEN {waiting_mark}
                           ELSE {pending_mark} END
             END"
        );
        let claim = |ordered: bool| {
            let (parked, key_order) = if ordered {
                (
                    parked.clone(),
                    format!(
                        "AND NOT EXISTS (
                            SELECT 1 FROM {events} p
                            WHERE p.partition_key = c.partition_key AND p.status = 1 AND {earlier})"
                    ),
                )
            } else {
                ("0".to_owned(), String::new())
            };
            // `status IN (0, 1)` repeats the live index's condition word
            // for word: SQLite uses a partial index only for a query whose
            // WHERE contains its condition, and `status = 0` does not count.
            // Without it every claim read the whole backlog through another
            // index and sorted it (quadratic in the backlog).
            format!(
                "SELECT c.sequence, c.partition_key, c.suspect, c.suspect_span, {parked} AS parked
                 FROM {events} c
                 WHERE c.status IN (0, 1) AND {CLAIMABLE} {key_order}
                 ORDER BY COALESCE(c.ord, c.sequence), c.sequence
                 LIMIT ?2"
            )
        };
        Self {
            admin: AdminQueries::over_rows(
                names,
                "?1",
                |n| format!("?{n}"),
                "(COALESCE(e2.ord, e2.sequence), e2.sequence) \
                 < (COALESCE(b.ord, b.sequence), b.sequence)",
                format!(
                    "UPDATE {events} SET status = 0, blocks_key = 0, attempts = 0,
                         unfinished_claims = 0, suspect = 0, available_at = ?2
                     WHERE event_id = ?1 AND status = 3 AND superseded_by IS NULL
                     RETURNING attempts, partition_key"
                ),
                format!(
                    "UPDATE {events} SET blocks_key = 0
                     WHERE event_id = ?1 AND status = 3 AND superseded_by IS NULL
                     RETURNING attempts, partition_key"
                ),
            ),
            // Store time: this host's clock in microseconds, plus the shift
            // tests set.
            now: format!(
                "SELECT CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER) + clock_shift_us AS now
                 FROM {control} WHERE id = 1"
            ),
            sync_clock: format!(
                "UPDATE {control} SET clock_shift_us = ?1 WHERE id = 1 AND clock_shift_us <> ?1"
            ),
            enqueue: format!(
                "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type,
                     partition_key, payload, payload_version, headers, created_at, available_at)
                 SELECT json_extract(value, '$.id'), json_extract(value, '$.at'),
                     json_extract(value, '$.ai'), json_extract(value, '$.et'),
                     json_extract(value, '$.pk'), json_extract(value, '$.p'),
                     json_extract(value, '$.v'), json_extract(value, '$.h'), ?2,
                     ?2 + COALESCE(json_extract(value, '$.d'), 0) * 1000
                 FROM json_each(?1) WHERE true
                 ON CONFLICT (event_id) DO NOTHING
                 RETURNING event_id, sequence"
            ),
            in_flight: format!(
                "SELECT sequence, lease_id, COALESCE(lease_owner, '') AS lease_owner,
                        lease_expires_at, lease_unstarted, suspect, suspect_span
                 FROM {events} WHERE status = 1"
            ),
            return_rows: format!(
                "UPDATE {events} SET status = 0, lease_expires_at = NULL, lease_unstarted = 0
                 WHERE status = 1 AND sequence IN (SELECT value FROM json_each(?1))"
            ),
            mark_unstarted: format!(
                "UPDATE {events} SET lease_unstarted = 1
                 WHERE status = 1 AND sequence IN (SELECT value FROM json_each(?1))"
            ),
            reap: format!(
                "UPDATE {events} AS e
                 SET status = 0, lease_expires_at = NULL, suspect = 1, lease_unstarted = 0,
                     suspect_span = l.span, unfinished_claims = e.unfinished_claims + l.culprit
                 FROM (SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS culprit,
                              json_extract(value, '$[2]') AS span
                       FROM json_each(?1)) AS l
                 WHERE e.sequence = l.seq"
            ),
            read_rows: format!(
                "SELECT {EVENT_COLUMNS}, fencing_token FROM {events}
                 WHERE sequence IN (SELECT value FROM json_each(?1))"
            ),
            lease_rows: format!(
                "UPDATE {events} SET status = 1, fencing_token = fencing_token + 1,
                     lease_id = ?2, lease_unstarted = 0, lease_owner = ?3, lease_expires_at = ?4
                 WHERE sequence IN (SELECT value FROM json_each(?1))"
            ),
            fail_rows: format!(
                "UPDATE {events} SET status = 3, blocks_key = ?2, unfinished_claims = 0, suspect = 0,
                     lease_expires_at = NULL
                 WHERE sequence IN (SELECT value FROM json_each(?1))"
            ),
            held: format!(
                "SELECT sequence, lease_id, suspect, suspect_span FROM {events}
                 WHERE status = 1 AND sequence IN (SELECT value FROM json_each(?1))"
            ),
            crash_loops: format!(
                "UPDATE {events} AS c
                 SET status = 3, blocks_key = ?3, unfinished_claims = 0, suspect = 0,
                     lease_expires_at = NULL
                 WHERE c.status = 0 AND c.unfinished_claims > 0
                   AND c.unfinished_claims >= ?2 AND {CLAIMABLE}
                   AND NOT EXISTS (
                       SELECT 1 FROM {events} p
                       WHERE p.partition_key = c.partition_key
                         AND (p.status IN (0, 1) OR p.blocks_key) AND {earlier})
                 RETURNING {EVENT_COLUMNS}"
            ),
            claim_per_key: claim(true),
            claim_unordered: claim(false),
            park_rows: format!(
                "UPDATE {events} SET status = ?2
                 WHERE status = 0 AND sequence IN (SELECT value FROM json_each(?1))"
            ),
            any_waiting: format!("SELECT 1 AS n FROM {events} WHERE status = 5 LIMIT 1"),
            unpark_waiting: format!(
                "UPDATE {events} SET status = 0
                 WHERE status = 5 AND partition_key IN (SELECT value FROM json_each(?1))"
            ),
            // Rows waiting behind no row of their key not yet due (its head
            // was leased by an earlier release or failed by a crash loop).
            // Every row set aside, for an unordered claim: it honours no
            // key's order, and publishes them as it did before they were
            // (one status a statement: each reads its own partial index).
            unpark_all: [4, 5].map(|status| {
                format!("UPDATE {events} SET status = 0 WHERE status = {status}")
            }),
            heal_waiting: format!(
                "UPDATE {events} AS c SET status = 0
                 WHERE c.status = 5 AND NOT EXISTS (
                     SELECT 1 FROM {events} p
                     WHERE p.partition_key = c.partition_key AND p.status = 0
                       AND p.available_at > ?1 AND {earlier})"
            ),
            unpark_key: format!(
                "UPDATE {events} SET status = 0 WHERE partition_key = ?1 AND status = 4"
            ),
            // Rows parked behind no failed blocking row: the block was
            // lifted by a tool that did not unpark them (an earlier
            // release, SQL by hand).
            heal_parked: format!(
                "UPDATE {events} AS c SET status = 0
                 WHERE c.status = 4 AND NOT EXISTS (
                     SELECT 1 FROM {events} p
                     WHERE p.partition_key = c.partition_key AND p.blocks_key AND p.status = 3
                       AND {earlier})"
            ),
            ack: format!(
                "UPDATE {events} AS e
                 SET status = 2, published_at = ?2, unfinished_claims = 0, suspect = 0,
                     lease_expires_at = NULL
                 FROM (SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS token
                       FROM json_each(?1)) AS l
                 WHERE e.sequence = l.seq AND e.fencing_token = l.token AND e.status = 1
                 RETURNING event_id"
            ),
            nack: format!(
                "UPDATE {events} AS e
                 SET status = l.new_status, blocks_key = l.blocks_key,
                     available_at = COALESCE(l.available_at, e.available_at),
                     attempts = e.attempts + 1, unfinished_claims = 0, suspect = 0,
                     lease_expires_at = NULL
                 FROM (SELECT json_extract(value, '$.s') AS seq, json_extract(value, '$.t') AS token,
                              json_extract(value, '$.st') AS new_status, json_extract(value, '$.b') AS blocks_key,
                              json_extract(value, '$.a') AS available_at
                       FROM json_each(?1)) AS l
                 WHERE e.sequence = l.seq AND e.fencing_token = l.token AND e.status = 1
                 RETURNING event_id, attempts, COALESCE(lease_owner, '') AS lease_owner"
            ),
            release: format!(
                "UPDATE {events} AS e
                 SET status = 0, lease_expires_at = NULL,
                     suspect = e.suspect OR l.started,
                     suspect_span = CASE WHEN l.started THEN l.span ELSE e.suspect_span END,
                     unfinished_claims = e.unfinished_claims + l.culprit
                 FROM (SELECT json_extract(value, '$[0]') AS seq, json_extract(value, '$[1]') AS token,
                              json_extract(value, '$[2]') AS started, json_extract(value, '$[3]') AS culprit,
                              json_extract(value, '$[4]') AS span
                       FROM json_each(?1)) AS l
                 WHERE e.sequence = l.seq AND e.fencing_token = l.token AND e.status = 1
                 RETURNING event_id"
            ),
            record_many: format!(
                "INSERT INTO {attempts} (event_id, kind, at, actor, error_class, detail, attempts)
                 SELECT json_extract(value, '$.id'), json_extract(value, '$.k'), ?1,
                        json_extract(value, '$.actor'), json_extract(value, '$.c'),
                        json_extract(value, '$.d'), json_extract(value, '$.n')
                 FROM json_each(?2)"
            ),
            heartbeat: format!(
                "INSERT INTO {relays} (relay, last_seen, clock_skew_ms, outage_since,
                     outage_destination, outage_reason)
                 VALUES (?1, ?2, ?3, CASE WHEN ?4 IS NULL THEN NULL ELSE ?2 END, ?4, ?5)
                 ON CONFLICT (relay) DO UPDATE
                 SET last_seen = excluded.last_seen, clock_skew_ms = excluded.clock_skew_ms,
                     outage_since = CASE WHEN excluded.outage_destination IS NULL THEN NULL
                         ELSE COALESCE(outage_since, excluded.outage_since) END,
                     outage_destination = excluded.outage_destination,
                     outage_reason = excluded.outage_reason"
            ),
            supersede_lock: format!(
                "SELECT COALESCE(ord, sequence) AS ord_key, attempts, partition_key FROM {events}
                 WHERE event_id = ?1 AND status = 3 AND superseded_by IS NULL"
            ),
            supersede_insert: format!(
                "INSERT INTO {events} (ord, event_id, aggregate_type, aggregate_id, event_type,
                     partition_key, payload, payload_version, headers, created_at, available_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, COALESCE(?11, ?10))
                 ON CONFLICT (event_id) DO NOTHING
                 RETURNING sequence"
            ),
            supersede_mark: format!(
                "UPDATE {events} SET blocks_key = 0, superseded_by = ?2 WHERE event_id = ?1"
            ),
            purge_history: format!(
                "DELETE FROM {attempts} WHERE event_id IN (
                     SELECT event_id FROM {events}
                     WHERE status = 2 AND published_at <= ?1 ORDER BY published_at LIMIT ?2)"
            ),
            purge: format!(
                "DELETE FROM {events} WHERE sequence IN (
                     SELECT sequence FROM {events}
                     WHERE status = 2 AND published_at <= ?1 ORDER BY published_at LIMIT ?2)"
            ),
            inbox_claim: format!(
                "INSERT INTO {inbox} (consumer, event_id, claimed_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (consumer, event_id) DO NOTHING"
            ),
            inbox_purge: format!(
                "DELETE FROM {inbox} WHERE rowid IN (
                     SELECT rowid FROM {inbox} WHERE claimed_at <= ?1 LIMIT ?2)"
            ),
        }
    }
}
