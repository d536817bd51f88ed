//! Every PostgreSQL statement, built once from validated table names.

use crate::config::TableNames;

/// Columns that rebuild a [`outbox_core::StoredEvent`], in `row::decode` order.
pub(super) const EVENT_COLUMNS: &str = "sequence, event_id, aggregate_type, aggregate_id, \
    event_type, partition_key, payload::text AS payload, payload_version, headers::text AS headers, \
    created_at, available_at, attempts";

pub(super) struct Queries {
    pub(super) channel: String,
    pub(super) lock_key: i64,
    pub(super) enqueue: String,
    pub(super) crash_loops: String,
    pub(super) claim_per_key: String,
    pub(super) claim_unordered: String,
    pub(super) ack: String,
    pub(super) nack: String,
    pub(super) release: String,
    pub(super) heartbeat: String,
    pub(super) stats: String,
    pub(super) event_state: String,
    pub(super) failed_events: String,
    pub(super) history: String,
    pub(super) history_many: String,
    pub(super) blocked_keys: String,
    pub(super) requeue: String,
    pub(super) skip: String,
    pub(super) supersede_lock: String,
    pub(super) supersede_insert: String,
    pub(super) supersede_mark: String,
    pub(super) record: String,
    pub(super) purge: String,
    pub(super) relays: String,
    pub(super) inbox_claim: String,
    pub(super) inbox_purge: String,
}

/// Rows a claim may take: pending and due, or leased with an expired lease.
const CLAIMABLE: &str =
    "CASE WHEN c.status = 0 THEN c.available_at <= $1 ELSE c.lease_expires_at <= $1 END";

impl Queries {
    pub(super) fn new(names: &TableNames) -> Self {
        let events = names.events();
        let attempts = names.attempts();
        let inbox = names.inbox();
        let relays = names.relays();
        let seq = format!("{}{}_events_seq", names.qualifier(), names.prefix());
        let claim = |ordered: bool| {
            // An earlier row of the key that is unsettled and not claimable
            // itself (leased, parked for backoff, or failed and blocking)
            // holds the key back. Earlier claimable rows come first in the
            // global order, so the LIMIT keeps each key's prefix.
            let key_order = if ordered {
                format!(
                    "AND NOT EXISTS (
                        SELECT 1 FROM {events} p
                        WHERE p.partition_key = c.partition_key
                          AND (p.status IN (0, 1) OR p.blocks_key)
                          AND (p.order_xid, p.ord) < (c.order_xid, c.ord)
                          AND NOT (p.status = 0 AND p.available_at <= $1
                                   OR p.status = 1 AND p.lease_expires_at <= $1)
                        -- OFFSET 0 keeps this a per-candidate index probe:
                        -- flattened into an anti-join, the planner may
                        -- misjudge the held-back rows as one and seq-scan the
                        -- whole table on every claim.
                        OFFSET 0)"
                )
            } else {
                String::new()
            };
            format!(
                "UPDATE {events} AS e
                 SET status = 1, fencing_token = e.fencing_token + 1,
                     unfinished_claims = e.unfinished_claims + 1,
                     lease_owner = $2, lease_expires_at = $3
                 FROM (
                     SELECT c.sequence FROM {events} c
                     WHERE c.status IN (0, 1) AND {CLAIMABLE}
                       AND c.order_xid < pg_snapshot_xmin(pg_current_snapshot())
                       {key_order}
                     ORDER BY c.order_xid, c.ord
                     LIMIT $4
                 ) AS picked
                 WHERE e.sequence = picked.sequence
                 RETURNING {cols}, e.fencing_token, e.lease_expires_at,
                           e.order_xid::text::bigint AS order_xid, e.ord",
                cols = prefixed_columns("e")
            )
        };
        Self {
            channel: format!("{}_events", names.prefix()),
            lock_key: lock_key(&events),
            enqueue: format!(
                "INSERT INTO {events} (sequence, ord, event_id, aggregate_type, aggregate_id,
                     event_type, partition_key, payload, payload_version, headers, created_at, available_at)
                 SELECT s, s, event_id, aggregate_type, aggregate_id, event_type, partition_key,
                     payload::jsonb, payload_version, headers::jsonb, $10, COALESCE(available_at, $10)
                 FROM (
                     SELECT nextval('{seq}') AS s, u.*
                     FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                                 $6::text[], $7::int4[], $8::text[], $9::timestamptz[])
                          WITH ORDINALITY AS u(event_id, aggregate_type, aggregate_id, event_type,
                                               partition_key, payload, payload_version, headers,
                                               available_at, n)
                     ORDER BY n
                 ) AS x
                 ON CONFLICT (event_id) DO NOTHING
                 RETURNING event_id, sequence"
            ),
            crash_loops: format!(
                "WITH looped AS (
                     UPDATE {events} AS c
                     SET status = 3, blocks_key = $3, unfinished_claims = 0, lease_expires_at = NULL
                     WHERE c.status IN (0, 1) AND c.unfinished_claims > 0
                       AND c.unfinished_claims >= $2 AND {CLAIMABLE}
                       AND NOT EXISTS (
                           SELECT 1 FROM {events} p
                           WHERE p.partition_key = c.partition_key
                             AND (p.status IN (0, 1) OR p.blocks_key)
                             AND (p.order_xid, p.ord) < (c.order_xid, c.ord)
                           OFFSET 0)
                     RETURNING {cols}
                 ), history AS (
                     INSERT INTO {attempts} (event_id, kind, at, actor, error_class, detail, attempts)
                     SELECT event_id, 'CrashLoop', $1, $4, NULL,
                            CAST($2 AS text) || ' publish attempts started and none finished', attempts
                     FROM looped
                 )
                 SELECT * FROM looped",
                cols = prefixed_columns("c")
            ),
            claim_per_key: claim(true),
            claim_unordered: claim(false),
            ack: format!(
                "UPDATE {events} AS e
                 SET status = 2, published_at = $3, unfinished_claims = 0, lease_expires_at = NULL
                 FROM UNNEST($1::int8[], $2::int8[]) AS l(sequence, token)
                 WHERE e.sequence = l.sequence AND e.fencing_token = l.token AND e.status = 1
                 RETURNING e.event_id"
            ),
            nack: format!(
                "WITH l AS (
                     SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int2[], $4::bool[],
                                          $5::timestamptz[], $6::text[], $7::text[], $8::text[])
                         AS l(sequence, token, new_status, blocks_key, available_at, kind, error_class, error)
                 ), settled AS (
                     UPDATE {events} AS e
                     SET status = l.new_status, blocks_key = l.blocks_key,
                         available_at = COALESCE(l.available_at, e.available_at),
                         attempts = e.attempts + 1, unfinished_claims = 0, lease_expires_at = NULL
                     FROM l
                     WHERE e.sequence = l.sequence AND e.fencing_token = l.token AND e.status = 1
                     RETURNING e.event_id, e.attempts, e.lease_owner, l.kind, l.error_class, l.error
                 ), history AS (
                     INSERT INTO {attempts} (event_id, kind, at, actor, error_class, detail, attempts)
                     SELECT event_id, kind, $9, COALESCE(lease_owner, ''), error_class, error, attempts
                     FROM settled
                 )
                 SELECT event_id FROM settled"
            ),
            release: format!(
                "UPDATE {events} AS e
                 SET status = 0, lease_expires_at = NULL,
                     unfinished_claims = CASE WHEN l.started THEN e.unfinished_claims
                                              ELSE GREATEST(e.unfinished_claims - 1, 0) END
                 FROM UNNEST($1::int8[], $2::int8[], $3::bool[]) AS l(sequence, token, started)
                 WHERE e.sequence = l.sequence AND e.fencing_token = l.token AND e.status = 1
                 RETURNING e.event_id"
            ),
            heartbeat: format!(
                "INSERT INTO {relays} (relay, last_seen) VALUES ($1, $2)
                 ON CONFLICT (relay) DO UPDATE SET last_seen = EXCLUDED.last_seen"
            ),
            stats: format!(
                "SELECT event_type,
                     count(*) FILTER (WHERE status = 0 AND available_at <= $1) AS claimable,
                     min(available_at) FILTER (WHERE status = 0 AND available_at <= $1) AS oldest,
                     count(*) FILTER (WHERE status = 0 AND available_at > $1) AS parked,
                     count(*) FILTER (WHERE status = 1) AS in_flight,
                     count(*) FILTER (WHERE status = 3) AS failed
                 FROM {events} WHERE status IN (0, 1, 3)
                 GROUP BY event_type ORDER BY event_type"
            ),
            event_state: format!(
                "SELECT status, available_at, attempts, lease_owner, lease_expires_at, published_at,
                        blocks_key, superseded_by
                 FROM {events} WHERE event_id = $1"
            ),
            failed_events: format!(
                "SELECT {EVENT_COLUMNS}, blocks_key, superseded_by FROM {events}
                 WHERE status = 3 ORDER BY sequence LIMIT $1"
            ),
            history: format!(
                "SELECT event_id, kind, at, actor, error_class, detail, attempts
                 FROM {attempts} WHERE event_id = $1 ORDER BY id"
            ),
            history_many: format!(
                "SELECT event_id, kind, at, actor, error_class, detail, attempts
                 FROM {attempts} WHERE event_id = ANY($1) ORDER BY id"
            ),
            blocked_keys: format!(
                "SELECT DISTINCT ON (b.partition_key) b.partition_key, b.event_id,
                     (SELECT count(*) FROM {events} p
                      WHERE p.partition_key = b.partition_key AND p.status IN (0, 1)) AS backlog
                 FROM {events} b WHERE b.status = 3 AND b.blocks_key
                 ORDER BY b.partition_key, b.order_xid, b.ord"
            ),
            requeue: format!(
                "UPDATE {events} SET status = 0, blocks_key = FALSE, attempts = 0,
                     unfinished_claims = 0, available_at = $2
                 WHERE event_id = $1 AND status = 3 AND superseded_by IS NULL
                 RETURNING attempts"
            ),
            skip: format!(
                "UPDATE {events} SET blocks_key = FALSE
                 WHERE event_id = $1 AND status = 3 AND superseded_by IS NULL
                 RETURNING attempts"
            ),
            supersede_lock: format!(
                "SELECT order_xid::text AS order_xid, ord, attempts FROM {events}
                 WHERE event_id = $1 AND status = 3 AND superseded_by IS NULL FOR UPDATE"
            ),
            supersede_insert: format!(
                "INSERT INTO {events} (sequence, order_xid, ord, event_id, aggregate_type, aggregate_id,
                     event_type, partition_key, payload, payload_version, headers, created_at, available_at)
                 VALUES (nextval('{seq}'), $1::text::xid8, $2, $3, $4, $5, $6, $7, $8::jsonb, $9,
                         $10::jsonb, $11, COALESCE($12, $11))
                 ON CONFLICT (event_id) DO NOTHING
                 RETURNING sequence"
            ),
            supersede_mark: format!(
                "UPDATE {events} SET blocks_key = FALSE, superseded_by = $2 WHERE event_id = $1"
            ),
            record: format!(
                "INSERT INTO {attempts} (event_id, kind, at, actor, error_class, detail, attempts)
                 VALUES ($1, $2, $3, $4, NULL, $5, $6)"
            ),
            purge: format!(
                "WITH doomed AS (
                     DELETE FROM {events} WHERE sequence IN (
                         SELECT sequence FROM {events}
                         WHERE status = 2 AND published_at <= $1
                         ORDER BY published_at LIMIT $2)
                     RETURNING event_id
                 ), history AS (
                     DELETE FROM {attempts} WHERE event_id IN (SELECT event_id FROM doomed)
                 )
                 SELECT count(*) FROM doomed"
            ),
            relays: format!("SELECT relay, last_seen FROM {relays} ORDER BY relay"),
            inbox_claim: format!(
                "INSERT INTO {inbox} (consumer, event_id, claimed_at) VALUES ($1, $2, $3)
                 ON CONFLICT (consumer, event_id) DO NOTHING"
            ),
            inbox_purge: format!(
                "DELETE FROM {inbox} WHERE (consumer, event_id) IN (
                     SELECT consumer, event_id FROM {inbox} WHERE claimed_at <= $1 LIMIT $2)"
            ),
        }
    }
}

fn prefixed_columns(alias: &str) -> String {
    EVENT_COLUMNS
        .split(", ")
        .map(|c| match c.split_once("::text AS ") {
            Some((col, name)) => format!("{alias}.{col}::text AS {name}"),
            None => format!("{alias}.{c}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A stable advisory-lock key per events table (FNV-1a of its name): claims
/// on one table take turns, claims on different tables never wait.
fn lock_key(events_table: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in events_table.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_columns_keep_casts() {
        let cols = prefixed_columns("e");
        assert!(cols.starts_with("e.sequence, e.event_id"));
        assert!(cols.contains("e.payload::text AS payload"));
    }

    #[test]
    fn lock_keys_differ_per_table() {
        assert_ne!(lock_key("a_events"), lock_key("b_events"));
        assert_eq!(lock_key("a_events"), lock_key("a_events"));
    }
}
