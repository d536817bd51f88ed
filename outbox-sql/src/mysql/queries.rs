//! Every MySQL/MariaDB statement, built once from validated table names.
//! Rows are addressed by primary key through `IN (?, …)` lists, so each
//! statement locks exactly its batch; per-row values travel as one JSON
//! parameter joined with `JSON_TABLE`.

use crate::admin_queries::{AdminQueries, EVENT_COLUMNS};
use crate::config::TableNames;

/// Pending and due (`?` is now). Expired leases are reaped before any
/// claim looks for candidates.
const CLAIMABLE: &str = "(c.status = 0 AND c.available_at <= ?)";

/// Every statement, built once from validated names. Each field is the
/// statement of the store operation it is named after; its parameters and
/// result columns are what the adapter binds and maps (see the store that
/// uses it).
#[allow(missing_docs)]
pub struct Queries {
    pub admin: AdminQueries,
    pub now: String,
    pub sync_clock: String,
    pub lock_keys: String,
    pub enqueue_head: String,
    pub enqueue_row: &'static str,
    pub enqueue_tail: &'static str,
    pub read_back: String,
    pub claim_lock: String,
    pub flight_floor: String,
    pub move_flight_floor: String,
    pub in_flight: String,
    pub lock_expired: String,
    pub reap: String,
    pub return_rows: String,
    pub mark_unstarted: String,
    pub crash_loop_candidates: String,
    pub claim_candidates_per_key: String,
    pub claim_candidates_unordered: String,
    pub lock_rows: String,
    pub blockers_of: String,
    pub park_rows: String,
    pub unpark_waiting: String,
    pub note_waiting: String,
    pub forget_waiting: String,
    pub waiting_unheld: String,
    pub unpark_key: String,
    pub parked_unblocked: String,
    pub set_aside_rows: String,
    pub unpark_rows: String,
    pub superseded_keys: String,
    pub fail_rows: String,
    pub lease_rows: String,
    pub record_lease_owner: String,
    pub forget_lease_owners: String,
    pub forget_every_lease_owner: String,
    pub lease_owners_of: String,
    pub read_rows: String,
    pub lock_leased: String,
    pub ack: String,
    pub superseded_blocking: String,
    pub unblock_superseded: String,
    pub nack: String,
    pub release: String,
    pub record_many: String,
    pub heartbeat: String,
    pub select_failed: String,
    pub supersede_mark: String,
    pub purge_select: String,
    pub purge_history: String,
    pub purge: String,
    pub inbox_claim: String,
    pub inbox_purge: String,
}

/// `query` with its `{in}` replaced by `n` placeholders: rows addressed by
/// primary key, so a statement locks exactly the rows of its batch.
pub fn with_in_list(query: &str, n: usize) -> String {
    query.replace("{in}", &placeholders(n.max(1)))
}

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// `query` with its `{ranges}` replaced by `n` key ranges, each binding a
/// key then a sequence: the key's rows after that one, read from the
/// key's index (not its history before).
pub fn with_key_ranges(query: &str, n: usize) -> String {
    let range = "(partition_key = ? AND blocks_key = FALSE AND sequence > ?)";
    query.replace("{ranges}", &vec![range; n.max(1)].join(" OR "))
}

/// At most this many keys in flight are listed in a per-key claim's
/// `NOT IN` (a statement takes at most 65,535 parameters); the claim leaves
/// out the rest's candidates itself, as it reads them.
pub const MAX_LISTED_KEYS: usize = 4_096;

/// The per-key claim with its `{not_in_flight}` condition for `keys`
/// keys in flight (bound after the first `now`; at most
/// [`MAX_LISTED_KEYS`]): none, or `NOT IN` a list, which MariaDB and MySQL
/// search as a sorted array.
pub fn with_keys_in_flight(query: &str, keys: usize) -> String {
    let condition = match keys {
        0 => String::new(),
        n => format!("AND c.partition_key NOT IN ({})", placeholders(n)),
    };
    query.replace("{not_in_flight}", &condition)
}

impl Queries {
    /// The statements for these table names.
    pub fn new(names: &TableNames) -> Self {
        let [events, attempts, inbox, relays] = names.main_four();
        let keys = format!("{}{}_keys", names.qualifier(), names.prefix());
        let claim_lock = format!("{}{}_claim_lock", names.qualifier(), names.prefix());
        let clock = format!("{}{}_clock", names.qualifier(), names.prefix());
        let owners = format!("{}{}_lease_owners", names.qualifier(), names.prefix());
        let waiting_keys = format!("{}{}_waiting_keys", names.qualifier(), names.prefix());
        // Claims read pending rows in sequence order from the live index,
        // never the primary key (that would walk every published row).
        let live = format!("{}_events_live", names.prefix());
        let by_key = format!("{}_events_key", names.prefix());
        let by_key_due = format!("{}_events_key_due", names.prefix());
        // An earlier row of the key that holds it back: pending and not
        // due (`backing_off`, binds `now` twice: the candidates' first
        // parameters), or failed and blocking
        // (`blocked`, unless `c` replaces it). Each kind is its own probe
        // reading one index entry or a few: the key's latest due time, and
        // only if that is ahead, its rows not due yet; its failed rows. One
        // probe over all kinds reads the key's whole backlog for every
        // candidate, quadratic in a key's backlog. (A correlated probe gets
        // `ref` access only, never a range past the key: hence ORDER BY …
        // LIMIT 1 rather than a range condition.) Keys with a row in flight are
        // left out before these probes run (`{not_in_flight}`), from the
        // rows in flight the claim has just read to reap: a probe for them
        // per candidate would need `status` in the key's index, and every
        // lease and ack would move an entry of it.
        // The failed-row check asks first for the key's first blocking row
        // and its first one not superseded: subqueries over the key alone,
        // which MariaDB's subquery cache answers once per key and
        // statement, so the rows parked behind a failure cost a cache
        // lookup each, not a probe (their key's rows sit together at the
        // head of the live range). Only a key with a superseded blocking
        // row reaches the exact probe (a replacement passes its original).
        let backing_off = format!(
            "(COALESCE((SELECT p.available_at FROM {events} p USE INDEX ({by_key_due})
                           WHERE p.partition_key = c.partition_key AND p.status = 0
                           ORDER BY p.available_at DESC LIMIT 1) > ?, FALSE)
                 AND EXISTS (SELECT 1 FROM {events} p USE INDEX ({by_key_due})
                             WHERE p.partition_key = c.partition_key AND p.status = 0
                               AND p.available_at > ? AND p.sequence < c.sequence))"
        );
        let blocked = format!(
            "(COALESCE((SELECT MIN(p.sequence) FROM {events} p USE INDEX ({by_key})
                           WHERE p.partition_key = c.partition_key AND p.blocks_key = TRUE
                             AND p.status = 3), c.sequence) < c.sequence
                 AND (COALESCE((SELECT MIN(p.sequence) FROM {events} p USE INDEX ({by_key})
                                WHERE p.partition_key = c.partition_key AND p.blocks_key = TRUE
                                  AND p.status = 3 AND p.superseded_by IS NULL),
                               c.sequence) < c.sequence
                      OR EXISTS (SELECT 1 FROM {events} p USE INDEX ({by_key})
                                 WHERE p.partition_key = c.partition_key AND p.blocks_key = TRUE
                                   AND p.sequence < c.sequence AND p.status = 3
                                   AND (p.superseded_by IS NULL
                                        OR p.superseded_by <> c.event_id))))"
        );
        // Per key, a row held back is returned too, marked `parked` with
        // the status it is set aside in: 4 behind a blocking row, 5 behind
        // a row not yet due. No later claim steps over it again (left in
        // the live index, 10,000 blocked keys cost every claim 10,000 rows
        // read and probed: 3x the clean drain's time). `key_waits` says
        // whether rows of the candidate's key wait aside: its head is due
        // now, so the claim sets them back (`unpark_waiting`) to lease
        // them behind it.
        let candidates = |ordered: bool| {
            let (parked, waits, order) = if ordered {
                (
                    format!(
                        "CASE WHEN {blocked} THEN {} WHEN {backing_off} THEN {} ELSE {} END",
                        crate::codes::PARKED,
                        crate::codes::WAITING,
                        crate::codes::PENDING
                    ),
                    format!(
                        "w.partition_key IS NOT NULL AS key_waits
                         FROM {events} c USE INDEX ({live})
                         LEFT JOIN {waiting_keys} w ON w.partition_key = c.partition_key"
                    ),
                    "{not_in_flight}",
                )
            } else {
                (
                    "0".to_owned(),
                    format!("FALSE AS key_waits FROM {events} c USE INDEX ({live})"),
                    "",
                )
            };
            format!(
                "SELECT c.sequence, c.partition_key, c.suspect, c.suspect_span, {parked} AS parked,
                        {waits}
                 WHERE {CLAIMABLE} {order}
                 ORDER BY c.sequence LIMIT ?"
            )
        };
        let mut queries = Self {
            admin: AdminQueries::over_rows(
                names,
                "?",
                |_| "?".into(),
                "e2.sequence < b.sequence",
                format!(
                    "UPDATE {events} SET status = 0, blocks_key = FALSE, attempts = 0,
                         unfinished_claims = 0, suspect = FALSE, available_at = ?
                     WHERE event_id = ? AND status = 3 AND superseded_by IS NULL"
                ),
                format!(
                    "UPDATE {events} SET blocks_key = FALSE
                     WHERE event_id = ? AND status = 3 AND superseded_by IS NULL"
                ),
            ),
            // Store time: the server's clock in microseconds, plus the
            // shift tests set.
            now: format!(
                "SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED) + clock_shift_us AS now
                 FROM {clock} WHERE id = 1"
            ),
            sync_clock: format!(
                "UPDATE {clock} SET clock_shift_us = ? WHERE id = 1 AND clock_shift_us <> ?"
            ),
            lock_keys: format!("INSERT INTO {keys} (partition_key) VALUES "),
            enqueue_head: format!(
                "INSERT INTO {events} (event_id, aggregate_type, aggregate_id, event_type,
                     partition_key, payload, payload_version, headers, created_at, available_at,
                     enqueue_mark, lease_expires_at, published_at) VALUES "
            ),
            // `lease_expires_at` starts as 0 and `published_at` as -1, not
            // NULL: a lease and an ack then rewrite the row in place (see
            // `lease_rows`).
            enqueue_row: "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, -1)",
            // A duplicate id is left alone: waits for a concurrent insert of
            // it, then does nothing (no error, whatever the isolation level).
            enqueue_tail: " ON DUPLICATE KEY UPDATE event_id = event_id",
            // Driven by the ids (a JSON array), not `event_id IN (…)`: on a
            // table whose statistics still say it is empty (just created or
            // emptied), MariaDB read an `IN` list back by scanning every row.
            read_back: format!(
                "SELECT STRAIGHT_JOIN e.event_id, e.sequence, e.enqueue_mark
                 FROM JSON_TABLE(?, '$[*]' COLUMNS (id CHAR(36) PATH '$')) AS r
                 JOIN {events} e ON e.event_id = r.id"
            ),
            claim_lock: format!("SELECT flight_from FROM {claim_lock} WHERE id = 1 FOR UPDATE"),
            // The first row in flight at or after `?`, or past the last row
            // when none is (later leases lower it themselves).
            flight_floor: format!(
                "SELECT COALESCE(
                     (SELECT MIN(sequence) FROM {events} USE INDEX ({live})
                      WHERE status = 1 AND sequence >= ?),
                     (SELECT COALESCE(MAX(sequence), 0) + 1 FROM {events})) AS floor"
            ),
            move_flight_floor: format!("UPDATE {claim_lock} SET flight_from = ? WHERE id = 1"),
            // Found without locking (a locking scan of the status index
            // deadlocks with settlements of live leases), then locked by
            // primary key, skipping rows a settlement holds right now.
            // The owner from the lease's record, or from the row where an
            // earlier release leased it.
            in_flight: format!(
                "SELECT e.sequence, e.partition_key, e.lease_id,
                        COALESCE(o.owner, e.lease_owner, '') AS lease_owner,
                        e.lease_expires_at, e.lease_unstarted, e.suspect, e.suspect_span
                 FROM {events} e USE INDEX ({live})
                 LEFT JOIN {owners} o ON o.lease_id = e.lease_id
                 WHERE e.status = 1 AND e.sequence >= ?"
            ),
            lock_expired: format!(
                "SELECT sequence, lease_id, suspect FROM {events}
                 WHERE status = 1 AND lease_expires_at <= ? AND sequence IN ({{in}})
                 FOR UPDATE SKIP LOCKED"
            ),
            reap: format!(
                "UPDATE {events} e
                 JOIN JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$[0]', culprit INT PATH '$[1]',
                                                    span INT PATH '$[2]')) AS l
                   ON e.sequence = l.seq
                 SET e.status = 0, e.lease_expires_at = 0, e.suspect = TRUE, e.lease_unstarted = FALSE,
                     e.suspect_span = l.span, e.unfinished_claims = e.unfinished_claims + l.culprit
                 WHERE e.sequence IN ({{in}})"
            ),
            // Every statement that takes rows out of flight (reap above,
            // this one, fail, nack and release below) sets their expiry to
            // 0, as enqueued, not NULL: only rows in flight are read for
            // it, and a NULL would make their next lease grow the row (see
            // `lease_rows`).
            return_rows: format!(
                "UPDATE {events} SET status = 0, lease_expires_at = 0, lease_unstarted = FALSE
                 WHERE sequence IN ({{in}})"
            ),
            mark_unstarted: format!(
                "UPDATE {events} SET lease_unstarted = TRUE WHERE status = 1 AND sequence IN ({{in}})"
            ),
            // At the head of its key: no earlier live row of the key (read
            // from the live index, bounded by the backlog ahead of it, not
            // by the key's published history) and no earlier blocking one.
            crash_loop_candidates: format!(
                "SELECT c.sequence FROM {events} c
                 WHERE c.status = 0 AND c.unfinished_claims > 0 AND c.unfinished_claims >= ? AND {CLAIMABLE}
                   AND NOT EXISTS (
                       SELECT 1 FROM {events} p USE INDEX ({live})
                       WHERE p.status IN (0, 1) AND p.sequence < c.sequence
                         AND p.partition_key = c.partition_key)
                   AND NOT EXISTS (
                       SELECT 1 FROM {events} p USE INDEX ({by_key})
                       WHERE p.partition_key = c.partition_key AND p.blocks_key = TRUE
                         AND p.sequence < c.sequence AND p.status = 3)"
            ),
            claim_candidates_per_key: candidates(true),
            claim_candidates_unordered: candidates(false),
            lock_rows: format!(
                "SELECT sequence FROM {events} c
                 WHERE {CLAIMABLE} AND c.sequence IN ({{in}})
                 FOR UPDATE SKIP LOCKED"
            ),
            // The blocking rows, not superseded, of keys whose rows a claim
            // found held back, read with a share lock: an operator's
            // requeue or skip (which locks the row to change it) either
            // finished before, and its key's rows are not parked, or waits
            // for this claim and unparks the rows it parks.
            blockers_of: format!(
                "SELECT partition_key, MIN(sequence) AS first FROM {events} USE INDEX ({by_key})
                 WHERE partition_key IN ({{in}}) AND blocks_key = TRUE AND status = 3
                   AND superseded_by IS NULL
                 GROUP BY partition_key
                 LOCK IN SHARE MODE"
            ),
            park_rows: format!(
                "UPDATE {events} SET status = ? WHERE sequence IN ({{in}}) AND status = 0"
            ),
            // `{{ranges}}`: each key's rows after its first candidate (see
            // `with_key_ranges`).
            unpark_waiting: format!("UPDATE {events} SET status = 0 WHERE status = 5 AND ({{ranges}})"),
            note_waiting: format!("INSERT IGNORE INTO {waiting_keys} (partition_key) VALUES {{values}}"),
            forget_waiting: format!("DELETE FROM {waiting_keys} WHERE partition_key IN ({{in}})"),
            // Rows waiting behind no row of their key that is not yet due
            // (its head was leased by an earlier release or failed by a
            // crash loop).
            waiting_unheld: format!(
                "SELECT c.sequence FROM {events} c USE INDEX ({live})
                 WHERE c.status = 5 AND NOT EXISTS (
                     SELECT 1 FROM {events} p USE INDEX ({by_key_due})
                     WHERE p.partition_key = c.partition_key AND p.status = 0
                       AND p.available_at > ? AND p.sequence < c.sequence)
                 LIMIT ?"
            ),
            // The key's rows, behind a blocking row that no longer blocks.
            unpark_key: format!(
                "UPDATE {events} SET status = 0
                 WHERE partition_key = ? AND blocks_key = FALSE AND status = 4"
            ),
            // Rows parked behind no blocking row: the block was lifted by a
            // tool that did not unpark them (an earlier release, SQL by
            // hand). Claims look for them now and then.
            parked_unblocked: format!(
                "SELECT c.sequence FROM {events} c USE INDEX ({live})
                 WHERE c.status = 4 AND NOT EXISTS (
                     SELECT 1 FROM {events} p USE INDEX ({by_key})
                     WHERE p.partition_key = c.partition_key AND p.blocks_key = TRUE
                       AND p.status = 3 AND p.sequence < c.sequence)
                 LIMIT ?"
            ),
            // Every row set aside, for an unordered claim: it honours no
            // key's order, and publishes them as it did before they were.
            set_aside_rows: format!(
                "SELECT sequence FROM {events} USE INDEX ({live}) WHERE status IN (4, 5) LIMIT ?"
            ),
            unpark_rows: format!(
                "UPDATE {events} SET status = 0 WHERE sequence IN ({{in}}) AND status IN (4, 5)"
            ),
            // Keys whose blocking row these replacements lift.
            superseded_keys: format!(
                "SELECT DISTINCT partition_key FROM {events}
                 WHERE superseded_by IN ({{in}}) AND blocks_key = TRUE"
            ),
            fail_rows: format!(
                "UPDATE {events} SET status = 3, blocks_key = ?, unfinished_claims = 0,
                     suspect = FALSE, lease_expires_at = 0
                 WHERE sequence IN ({{in}})"
            ),
            // Every column it sets keeps its size (the owner is the
            // lease's, in `record_lease_owner`; `lease_expires_at` is 0 or
            // a time before): InnoDB rewrites the rows in place. Writing a
            // name into a NULL owner grew each row, and rows that grow are
            // moved within their page or split it: half the lease's time.
            lease_rows: format!(
                "UPDATE {events} SET status = 1, fencing_token = fencing_token + 1,
                     lease_id = ?, lease_unstarted = FALSE, lease_expires_at = ?
                 WHERE sequence IN ({{in}})"
            ),
            record_lease_owner: format!(
                "INSERT INTO {owners} (lease_id, owner) VALUES (?, ?)"
            ),
            // Owners of leases with no row in flight (`{in}`: the leases
            // that have one). Nothing else locks these rows.
            forget_lease_owners: format!("DELETE FROM {owners} WHERE lease_id NOT IN ({{in}})"),
            forget_every_lease_owner: format!("DELETE FROM {owners}"),
            lease_owners_of: format!(
                "SELECT lease_id, owner FROM {owners} WHERE lease_id IN ({{in}})"
            ),
            read_rows: format!(
                "SELECT {EVENT_COLUMNS}, fencing_token FROM {events}
                 WHERE sequence IN ({{in}})
                 ORDER BY sequence"
            ),
            lock_leased: format!(
                "SELECT sequence, event_id, COALESCE(lease_owner, '') AS lease_owner, attempts,
                        fencing_token, status, lease_id, suspect, suspect_span
                 FROM {events} WHERE sequence IN ({{in}})
                 FOR UPDATE"
            ),
            // In place, as the lease (`lease_expires_at` is left as it is:
            // only rows in flight are read for it).
            ack: format!(
                "UPDATE {events} SET status = 2, published_at = ?, unfinished_claims = 0,
                     suspect = FALSE
                 WHERE sequence IN ({{in}})"
            ),
            // Whether any superseded event still blocks its key: a range
            // of the superseded index, empty unless an operator superseded
            // under Block. Only then does an ack run `unblock_superseded`,
            // which MariaDB plans over a 1,000-id list as a scan of the
            // whole table (every ack of a full batch read every row). A
            // join to the ids would probe the index instead, but a joined
            // UPDATE that scans waits on producers' uncommitted rows.
            superseded_blocking: format!(
                "SELECT 1 AS n FROM {events} WHERE superseded_by IS NOT NULL AND blocks_key LIMIT 1"
            ),
            unblock_superseded: format!(
                "UPDATE {events} SET blocks_key = FALSE
                 WHERE superseded_by IN ({{in}})"
            ),
            nack: format!(
                "UPDATE {events} e
                 JOIN JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$.s', new_status INT PATH '$.st',
                      blocks BOOLEAN PATH '$.b', available BIGINT PATH '$.a' NULL ON EMPTY)) AS l
                   ON e.sequence = l.seq
                 SET e.status = l.new_status, e.blocks_key = l.blocks,
                     e.available_at = COALESCE(l.available, e.available_at),
                     e.attempts = e.attempts + 1, e.unfinished_claims = 0, e.suspect = FALSE,
                     e.lease_expires_at = 0
                 WHERE e.sequence IN ({{in}})"
            ),
            release: format!(
                "UPDATE {events} e
                 JOIN JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$[0]', started BOOLEAN PATH '$[1]',
                                                    culprit INT PATH '$[2]', span INT PATH '$[3]')) AS l
                   ON e.sequence = l.seq
                 SET e.status = 0, e.lease_expires_at = 0,
                     e.suspect = e.suspect OR l.started,
                     e.suspect_span = CASE WHEN l.started THEN l.span ELSE e.suspect_span END,
                     e.unfinished_claims = e.unfinished_claims + l.culprit
                 WHERE e.sequence IN ({{in}})"
            ),
            record_many: format!(
                "INSERT INTO {attempts} (event_id, kind, at, actor, error_class, detail, attempts)
                 SELECT id, k, ?, actor, c, d, n FROM JSON_TABLE(?, '$[*]' COLUMNS (
                     id CHAR(36) PATH '$.id', k VARCHAR(32) PATH '$.k', actor VARCHAR(255) PATH '$.actor',
                     c VARCHAR(16) PATH '$.c' NULL ON EMPTY, d TEXT PATH '$.d', n INT PATH '$.n')) AS j"
            ),
            heartbeat: format!(
                "INSERT INTO {relays} (relay, last_seen, clock_skew_ms, outage_since,
                     outage_destination, outage_reason) VALUES (?, ?, ?, ?, ?, ?)
                 ON DUPLICATE KEY UPDATE last_seen = VALUES(last_seen),
                     clock_skew_ms = VALUES(clock_skew_ms),
                     outage_since = IF(VALUES(outage_destination) IS NULL, NULL,
                         COALESCE(outage_since, VALUES(outage_since))),
                     outage_destination = VALUES(outage_destination),
                     outage_reason = VALUES(outage_reason)"
            ),
            select_failed: format!(
                "SELECT attempts, blocks_key, partition_key FROM {events}
                 WHERE event_id = ? AND status = 3 AND superseded_by IS NULL FOR UPDATE"
            ),
            supersede_mark: format!(
                "UPDATE {events} SET superseded_by = ? WHERE event_id = ?"
            ),
            // From 0: rows not yet published hold -1 (or NULL).
            purge_select: format!(
                "SELECT sequence, event_id FROM {events}
                 WHERE status = 2 AND published_at BETWEEN 0 AND ? ORDER BY published_at LIMIT ?
                 FOR UPDATE SKIP LOCKED"
            ),
            purge_history: format!(
                "DELETE FROM {attempts}
                 WHERE event_id IN ({{in}})"
            ),
            purge: format!(
                "DELETE FROM {events} WHERE sequence IN ({{in}})"
            ),
            inbox_claim: format!(
                "INSERT INTO {inbox} (consumer, event_id, claimed_at) VALUES (?, ?, ?)"
            ),
            inbox_purge: format!("DELETE FROM {inbox} WHERE claimed_at <= ? LIMIT ?"),
        };
        // A row in flight names its owner through its lease's record.
        queries.admin.event_state = format!(
            "SELECT e.status, e.available_at, e.attempts,
                    COALESCE(o.owner, e.lease_owner) AS lease_owner, e.lease_expires_at,
                    e.published_at, e.blocks_key, e.superseded_by
             FROM {events} e LEFT JOIN {owners} o ON o.lease_id = e.lease_id AND e.status = 1
             WHERE e.event_id = ?"
        );
        queries
    }
}
