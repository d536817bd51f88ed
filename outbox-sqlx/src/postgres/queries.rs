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
    pub(super) anything_to_do: String,
    pub(super) wait_for_notify: String,
    pub(super) stop_waiting: String,
    pub(super) lock_and_reap: String,
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
    pub(super) prune_cursor_log: String,
    pub(super) relays: String,
    pub(super) inbox_claim: String,
    pub(super) inbox_purge: String,
}

// How the PostgreSQL store keeps state (see schema.sql):
// * a status-0 row before the cursor is published; the cursor moves when
//   an ack settles the rows in front of it, so the happy path never
//   updates an event row (publication costs one cursor update per batch);
// * a relay's claim is a lease row listing the sequences it holds;
// * rows that leave claim order (retrying, delayed, requeued, replacements)
//   are status 4 and found by their own index wherever the cursor is;
//   failures are status 3, publications out of cursor order status 2.

/// Claims and settlements commit without waiting for the WAL flush: a
/// database crash can forget the last few hundred milliseconds of them, which
/// only makes those events claimable again (published twice, absorbed by the
/// inbox). Enqueue, in the caller's transaction, keeps the caller's setting.
/// In FROM of the final SELECT of each settlement, evaluated once.
const ASYNC_COMMIT: &str = "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit";

impl Queries {
    pub(super) fn new(names: &TableNames) -> Self {
        let events = names.events();
        let attempts = names.attempts();
        let inbox = names.inbox();
        let relays = names.relays();
        let cursor = names.table("cursor");
        let cursor_log = names.table("cursor_log");
        let leases = names.table("leases");
        let seq = format!("{}{}_events_seq", names.qualifier(), names.prefix());
        let claim = |ordered: bool| {
            // An earlier row of the key that is unsettled and not claimable
            // itself (leased, not yet due, or failed and blocking) holds the
            // key back. Earlier claimable rows come first in the global
            // order, so the LIMIT keeps each key's prefix. A key with any
            // leased row waits whole (the lease's keys, a superset once it
            // is partly settled): rows that turn visible later come after
            // every leased row of claim order, so this holds back only
            // tracked rows that might otherwise go first, a delay and never
            // a reordering. OFFSET 0 keeps the tracked-row probe a
            // per-candidate index probe: flattened into an anti-join the
            // planner may misjudge the held rows as one and scan the table.
            let key_order = if ordered {
                format!(
                    "AND c.partition_key NOT IN (SELECT k FROM leased_keys)
                     AND NOT EXISTS (
                         SELECT 1 FROM {events} p
                         WHERE p.partition_key = c.partition_key
                           AND (p.status = 4 OR p.blocks_key)
                           AND (p.order_xid, p.ord) < (c.order_xid, c.ord)
                           AND (p.blocks_key
                                OR p.sequence IN (SELECT s FROM leased) OR p.available_at > $1)
                         OFFSET 0)"
                )
            } else {
                String::new()
            };
            format!(
                "WITH cur AS (SELECT order_xid, ord FROM {cursor} LIMIT 1),
                 leased AS (SELECT unnest(sequences) AS s FROM {leases}),
                 leased_keys AS (SELECT DISTINCT unnest(keys) AS k FROM {leases}),
                 candidates AS (
                     (SELECT x.* FROM cur CROSS JOIN LATERAL (
                          SELECT {cols}, c.order_xid AS xid, c.ord FROM {events} c
                          WHERE (c.order_xid, c.ord) >= (cur.order_xid, cur.ord) AND c.status = 0
                            AND c.unfinished_claims < $5
                            AND c.order_xid < pg_snapshot_xmin(pg_current_snapshot())
                            AND c.sequence NOT IN (SELECT s FROM leased)
                            {key_order}
                          ORDER BY c.order_xid, c.ord LIMIT $4) AS x)
                     UNION ALL
                     (SELECT x.* FROM cur CROSS JOIN LATERAL (
                          SELECT {cols}, c.order_xid AS xid, c.ord FROM {events} c
                          WHERE c.status = 4 AND c.available_at <= $1
                            AND c.unfinished_claims < $5
                            AND c.sequence NOT IN (SELECT s FROM leased)
                            {key_order}
                          ORDER BY c.order_xid, c.ord LIMIT $4) AS x)
                 ),
                 picked AS (SELECT * FROM candidates ORDER BY xid, ord LIMIT $4),
                 lease AS (
                     INSERT INTO {leases} (owner, expires_at, sequences, keys)
                     SELECT $2, $3, array_agg(sequence), array_agg(DISTINCT partition_key)
                     FROM picked HAVING count(*) > 0
                     RETURNING token, expires_at
                 )
                 SELECT picked.*, picked.xid::text::bigint AS order_xid,
                        lease.token AS fencing_token, lease.expires_at AS lease_expires_at
                 FROM picked CROSS JOIN lease",
                cols = prefixed_columns("c")
            )
        };
        // The leases named by a settlement, locked (a concurrent claim that
        // would reap them waits, or has already deleted them: fenced); the
        // settled rows are those the lease still holds; the lease keeps the
        // rest, or goes.
        let settle_head = |extra_types: &str, extra_names: &str| {
            format!(
                "WITH input AS (
                     SELECT * FROM UNNEST($1::int8[], $2::int8[]{extra_types})
                         AS i(sequence, token{extra_names})
                 ), held AS (
                     SELECT token, owner, sequences FROM {leases}
                     WHERE token IN (SELECT token FROM input) FOR UPDATE
                 ), valid AS (
                     SELECT i.*, h.owner FROM input i
                     JOIN (SELECT token, owner, unnest(sequences) AS s FROM held) h
                       ON h.token = i.token AND h.s = i.sequence
                 ), remaining AS (
                     SELECT h.token, ARRAY(SELECT s FROM unnest(h.sequences) AS s
                                           WHERE s NOT IN (SELECT sequence FROM valid)) AS rest
                     FROM held h
                 ), kept AS (
                     UPDATE {leases} l SET sequences = r.rest FROM remaining r
                     WHERE l.token = r.token AND cardinality(r.rest) > 0
                       AND cardinality(r.rest) < cardinality(l.sequences)
                 ), dropped AS (
                     DELETE FROM {leases} l USING remaining r
                     WHERE l.token = r.token AND cardinality(r.rest) = 0
                 )"
            )
        };
        // Moves the cursor to the first row still pending in claim order
        // (not settled by this statement), never past a running
        // transaction; never backwards (a concurrent settlement may have
        // moved it further). `now` is the settlement time.
        let move_cursor = |now: &str| {
            format!(
                ", cur AS (SELECT order_xid, ord FROM {cursor} LIMIT 1),
                 stop AS (
                     SELECT x.* FROM cur CROSS JOIN LATERAL (
                         SELECT c.order_xid, c.ord FROM {events} c
                         WHERE (c.order_xid, c.ord) >= (cur.order_xid, cur.ord) AND c.status = 0
                           AND c.sequence NOT IN (SELECT sequence FROM valid)
                         ORDER BY c.order_xid, c.ord LIMIT 1) AS x
                 ), target AS (
                     SELECT CASE WHEN s.order_xid < h.xmin THEN s.order_xid ELSE h.xmin END AS order_xid,
                            CASE WHEN s.order_xid < h.xmin THEN s.ord ELSE 0 END AS ord
                     FROM (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin) h
                     LEFT JOIN stop s ON TRUE
                 ), moved AS (
                     UPDATE {cursor} k SET order_xid = t.order_xid, ord = t.ord, moved_at = {now}
                     FROM target t WHERE (t.order_xid, t.ord) > (k.order_xid, k.ord)
                     RETURNING k.order_xid, k.ord
                 ), last_log AS (
                     SELECT order_xid, ord, at FROM {cursor_log}
                     ORDER BY order_xid DESC, ord DESC LIMIT 1
                 ), extended AS (
                     UPDATE {cursor_log} g SET order_xid = m.order_xid, ord = m.ord
                     FROM moved m, last_log l
                     WHERE (g.order_xid, g.ord) = (l.order_xid, l.ord)
                       AND l.at > {now} - interval '1 second'
                     RETURNING 1
                 ), logged AS (
                     INSERT INTO {cursor_log} (order_xid, ord, at)
                     SELECT m.order_xid, m.ord, {now} FROM moved m
                     WHERE NOT EXISTS (SELECT 1 FROM last_log l WHERE l.at > {now} - interval '1 second')
                     ON CONFLICT DO NOTHING
                 )"
            )
        };
        Self {
            channel: format!("{}_events", names.prefix()),
            lock_key: lock_key(&events),
            enqueue: format!(
                "INSERT INTO {events} (sequence, ord, event_id, aggregate_type, aggregate_id,
                     event_type, partition_key, payload, payload_version, headers, created_at,
                     available_at, status)
                 SELECT s, s, event_id, aggregate_type, aggregate_id, event_type, partition_key,
                     payload::jsonb, payload_version, headers::jsonb, $10, COALESCE(available_at, $10),
                     CASE WHEN available_at > $10 THEN 4 ELSE 0 END
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
            // One cheap statement instead of a claim transaction while idle:
            // anything pending in claim order, tracked and due, or leased
            // (leases expire, rows in them may crash-loop)?
            anything_to_do: format!(
                "SELECT EXISTS (SELECT 1 FROM {cursor} k CROSS JOIN LATERAL (
                                    SELECT 1 FROM {events} c
                                    WHERE (c.order_xid, c.ord) >= (k.order_xid, k.ord) AND c.status = 0
                                      AND c.order_xid < pg_snapshot_xmin(pg_current_snapshot())
                                    LIMIT 1) AS x)
                     OR EXISTS (SELECT 1 FROM {events} WHERE status = 4 AND available_at <= $1)
                     OR EXISTS (SELECT 1 FROM {leases})"
            ),
            // After this commits, every transaction that enqueued without
            // seeing the flag has committed (it held the shared lock), and
            // every later one notifies. The claim clears it. Producers wait
            // on the lock while this runs: it commits without waiting for
            // the WAL flush (lost in a crash, the flag only costs a poll).
            wait_for_notify: format!(
                "WITH lock AS (
                     SELECT pg_advisory_xact_lock(hashtext('{events}_wake'), 0),
                            set_config('synchronous_commit', 'off', true)
                 )
                 UPDATE {cursor} SET relay_waiting = TRUE
                 WHERE EXISTS (SELECT 1 FROM lock) AND NOT relay_waiting"
            ),
            stop_waiting: format!("UPDATE {cursor} SET relay_waiting = FALSE WHERE relay_waiting"),
            // The claim lock and JIT switch come first; the reaping is safe
            // on the statement's earlier snapshot (a lease another claimer
            // deleted meanwhile is skipped, never counted twice). A row at
            // the crash-loop limit is never claimed (the claim checks), so
            // skipping the sweep when this sees none costs no attempt.
            lock_and_reap: format!(
                "WITH lock AS (
                     SELECT pg_advisory_xact_lock($2) AS locked, set_config('jit', 'off', true) AS jit,
                            set_config('synchronous_commit', 'off', true) AS async_commit,
                            set_config('plan_cache_mode', 'force_generic_plan', true) AS generic
                 ), reaped AS (
                     DELETE FROM {leases} WHERE expires_at <= $1 AND EXISTS (SELECT 1 FROM lock)
                     RETURNING sequences
                 ), counted AS (
                     UPDATE {events} AS e SET unfinished_claims = e.unfinished_claims + 1
                     FROM (SELECT DISTINCT unnest(sequences) AS s FROM reaped) AS r
                     WHERE e.sequence = r.s AND e.status IN (0, 4)
                     RETURNING 1
                 ), awake AS (
                     UPDATE {cursor} SET relay_waiting = FALSE WHERE relay_waiting
                 )
                 SELECT EXISTS (SELECT 1 FROM lock)
                    AND (EXISTS (SELECT 1 FROM counted)
                         OR EXISTS (SELECT 1 FROM {events}
                                    WHERE status IN (0, 4) AND unfinished_claims > 0))"
            ),
            crash_loops: format!(
                "WITH cur AS (SELECT order_xid, ord FROM {cursor} LIMIT 1),
                 leased AS (SELECT unnest(sequences) AS s FROM {leases}),
                 looped AS (
                     UPDATE {events} AS c
                     SET status = 3, blocks_key = $3, unfinished_claims = 0
                     FROM cur
                     WHERE c.status IN (0, 4) AND c.unfinished_claims > 0
                       AND c.unfinished_claims >= $2 AND c.available_at <= $1
                       AND (c.status = 4 OR (c.order_xid, c.ord) >= (cur.order_xid, cur.ord))
                       AND c.sequence NOT IN (SELECT s FROM leased)
                       AND NOT EXISTS (
                           SELECT 1 FROM {events} p
                           WHERE p.partition_key = c.partition_key
                             AND (p.status = 4 OR p.blocks_key)
                             AND (p.order_xid, p.ord) < (c.order_xid, c.ord)
                           OFFSET 0)
                       -- Rare (rows at the crash-loop limit): a range of claim
                       -- order from the cursor, no index of its own.
                       AND NOT EXISTS (
                           SELECT 1 FROM {events} p
                           WHERE (p.order_xid, p.ord) >= (cur.order_xid, cur.ord)
                             AND (p.order_xid, p.ord) < (c.order_xid, c.ord)
                             AND p.partition_key = c.partition_key AND p.status = 0
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
            // Rows the cursor passes are published by that; the rest (out of
            // cursor order, tracked, or counted towards a crash loop) are
            // written as published.
            ack: format!(
                "{head}{cursor_move},
                 explicit AS (
                     UPDATE {events} e SET status = 2, published_at = $3, unfinished_claims = 0
                     FROM valid v, target t
                     WHERE e.sequence = v.sequence
                       AND (e.status = 4 OR e.unfinished_claims > 0
                            OR (e.order_xid, e.ord) >= (t.order_xid, t.ord))
                 )
                 SELECT v.sequence FROM {ASYNC_COMMIT}, valid v",
                head = settle_head("", ""),
                cursor_move = move_cursor("$3::timestamptz"),
            ),
            nack: format!(
                "{head}{cursor_move},
                 settled AS (
                     UPDATE {events} AS e
                     SET status = v.new_status, blocks_key = v.blocks_key,
                         available_at = COALESCE(v.available_at, e.available_at),
                         attempts = e.attempts + 1, unfinished_claims = 0
                     FROM valid v
                     WHERE e.sequence = v.sequence
                     RETURNING e.sequence, e.event_id, e.attempts, v.owner, v.kind, v.error_class, v.error
                 ), history AS (
                     INSERT INTO {attempts} (event_id, kind, at, actor, error_class, detail, attempts)
                     SELECT event_id, kind, $9, owner, error_class, error, attempts
                     FROM settled
                 )
                 SELECT sequence FROM {ASYNC_COMMIT}, settled",
                head = settle_head(
                    ", $3::int2[], $4::bool[], $5::timestamptz[], $6::text[], $7::text[], $8::text[]",
                    ", new_status, blocks_key, available_at, kind, error_class, error"
                ),
                cursor_move = move_cursor("$9::timestamptz"),
            ),
            release: format!(
                "{head}, counted AS (
                     UPDATE {events} e SET unfinished_claims = e.unfinished_claims + 1
                     FROM valid v WHERE e.sequence = v.sequence AND v.started
                 )
                 SELECT v.sequence FROM {ASYNC_COMMIT}, valid v",
                head = settle_head(", $3::bool[]", ", started"),
            ),
            heartbeat: format!(
                "INSERT INTO {relays} (relay, last_seen) VALUES ($1, $2)
                 ON CONFLICT (relay) DO UPDATE SET last_seen = EXCLUDED.last_seen"
            ),
            stats: format!(
                "WITH leased AS (SELECT unnest(sequences) AS s FROM {leases}),
                 open AS (
                     SELECT e.event_type, e.status, e.available_at, e.sequence IN (SELECT s FROM leased) AS held
                     FROM {cursor} k
                     JOIN LATERAL (SELECT * FROM {events} c
                                   WHERE (c.order_xid, c.ord) >= (k.order_xid, k.ord) AND c.status = 0) e ON TRUE
                     UNION ALL
                     SELECT e.event_type, e.status, e.available_at, e.sequence IN (SELECT s FROM leased)
                     FROM {events} e WHERE e.status = 4
                     UNION ALL
                     SELECT e.event_type, e.status, e.available_at, FALSE
                     FROM {events} e WHERE e.status = 3
                 )
                 SELECT event_type,
                     count(*) FILTER (WHERE status <> 3 AND NOT held AND available_at <= $1) AS claimable,
                     min(available_at) FILTER (WHERE status <> 3 AND NOT held AND available_at <= $1) AS oldest,
                     count(*) FILTER (WHERE status <> 3 AND NOT held AND available_at > $1) AS parked,
                     count(*) FILTER (WHERE status <> 3 AND held) AS in_flight,
                     count(*) FILTER (WHERE status = 3) AS failed
                 FROM open GROUP BY event_type ORDER BY event_type"
            ),
            // The state as the core models it: leased → in flight (1);
            // passed by the cursor → published (2), at the time the cursor
            // log says (to the second); tracked → pending (0).
            event_state: format!(
                "SELECT CASE WHEN l.token IS NOT NULL AND e.status IN (0, 4) THEN 1
                             WHEN e.status = 0 AND (e.order_xid, e.ord) < (k.order_xid, k.ord) THEN 2
                             WHEN e.status = 4 THEN 0
                             ELSE e.status END::int2 AS status,
                        e.available_at, e.attempts, l.owner AS lease_owner,
                        l.expires_at AS lease_expires_at,
                        CASE WHEN e.status = 0 AND (e.order_xid, e.ord) < (k.order_xid, k.ord)
                             THEN COALESCE((SELECT g.at FROM {cursor_log} g
                                            WHERE (g.order_xid, g.ord) > (e.order_xid, e.ord)
                                            ORDER BY g.order_xid, g.ord LIMIT 1), k.moved_at)
                             ELSE e.published_at END AS published_at,
                        e.blocks_key, e.superseded_by
                 FROM {events} e CROSS JOIN {cursor} k
                 LEFT JOIN LATERAL (SELECT token, owner, expires_at FROM {leases}
                                    WHERE e.sequence = ANY(sequences) LIMIT 1) l ON TRUE
                 WHERE e.event_id = $1"
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
                     (SELECT count(*) FROM {events} p, {cursor} k
                      WHERE p.partition_key = b.partition_key AND p.status = 0
                        AND (p.order_xid, p.ord) >= (k.order_xid, k.ord))
                     + (SELECT count(*) FROM {events} p
                        WHERE p.partition_key = b.partition_key AND p.status = 4) AS backlog
                 FROM {events} b WHERE b.status = 3 AND b.blocks_key
                 ORDER BY b.partition_key, b.order_xid, b.ord"
            ),
            requeue: format!(
                "UPDATE {events} SET status = 4, blocks_key = FALSE, attempts = 0,
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
                     event_type, partition_key, payload, payload_version, headers, created_at,
                     available_at, status)
                 VALUES (nextval('{seq}'), $1::text::xid8, $2, $3, $4, $5, $6, $7, $8::jsonb, $9,
                         $10::jsonb, $11, COALESCE($12, $11), 4)
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
            // Published rows at least a second older than the cutoff by the
            // cursor log (its granularity), or written published before it.
            purge: format!(
                "WITH bound AS (
                     SELECT order_xid, ord FROM {cursor_log}
                     WHERE at <= $1 - interval '1 second'
                     ORDER BY order_xid DESC, ord DESC LIMIT 1
                 ), picked AS (
                     SELECT sequence FROM (
                         (SELECT sequence FROM {events}
                          WHERE status = 2 AND published_at <= $1 ORDER BY published_at LIMIT $2)
                         UNION ALL
                         (SELECT e.sequence FROM {events} e, bound b
                          WHERE (e.order_xid, e.ord) < (b.order_xid, b.ord) AND e.status = 0
                          ORDER BY e.order_xid, e.ord LIMIT $2)
                     ) AS x LIMIT $2
                 ), doomed AS (
                     DELETE FROM {events} WHERE sequence IN (SELECT sequence FROM picked)
                     RETURNING event_id
                 ), history AS (
                     DELETE FROM {attempts} WHERE event_id IN (SELECT event_id FROM doomed)
                 )
                 SELECT count(*) FROM doomed"
            ),
            // Once no passed row is left before it, a log entry has no use.
            prune_cursor_log: format!(
                "DELETE FROM {cursor_log} g
                 WHERE g.at <= $1 - interval '1 second'
                   AND (g.order_xid, g.ord) < (SELECT order_xid, ord FROM {cursor_log}
                                               WHERE at <= $1 - interval '1 second'
                                               ORDER BY order_xid DESC, ord DESC LIMIT 1)"
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
