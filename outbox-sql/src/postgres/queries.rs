//! Every PostgreSQL statement, built once from validated table names. The
//! protocol itself (tick, claim, settlements) lives in the functions that
//! `schema/*.sql` install; these statements call them or read the tables.

use crate::admin_queries::{self, AdminQueries};
use crate::config::TableNames;

/// Columns that rebuild a [`outbox_core::RawEvent`], in `row::raw_event` order.
pub const EVENT_COLUMNS: &str = "sequence, event_id, aggregate_type, aggregate_id, \
    event_type, partition_key, payload::text AS payload, payload_version, headers::text AS headers, \
    created_at, available_at, attempts";

/// Every statement, built once from validated names. Each field is the
/// statement of the store operation it is named after; its parameters and
/// result columns are what the adapter binds and maps (see the store that
/// uses it).
#[allow(missing_docs)]
pub struct Queries {
    pub admin: AdminQueries,
    pub channel: String,
    pub claim_lock: i64,
    /// Held shared by every transaction that inserts events (the insert
    /// trigger), seen by a relay that has just asked for NOTIFY.
    pub producer_lock: i64,
    pub enqueue: String,
    /// The same for one event, its values as scalars.
    pub enqueue_one: String,
    pub sync_clock: String,
    pub probe: String,
    pub stop_waiting: String,
    pub watch_producers: String,
    pub claim: String,
    pub fail_unreadable: String,
    pub ack: String,
    pub nack: String,
    pub release: String,
    pub heartbeat: String,
    pub open_transactions: String,
    pub history_many: String,
    pub supersede_lock: String,
    pub supersede_insert: String,
    pub supersede_mark: String,
    /// `requeue` and `skip` on an array of event ids (`$1`), recording
    /// kind `$2`, operator `$3`, reason `$4`; returns `event_id`,
    /// `partition_key` of each changed.
    pub requeue_each: String,
    pub skip_each: String,
    /// Parked rows (`status` 5) of keys `$1` (an array) tracked again
    /// where nothing blocks their key any more.
    pub unpark_keys: String,
    pub record: String,
    pub purge: String,
    pub prune_cursor_log: String,
    pub inbox_claim: String,
    pub inbox_purge: String,
    /// Taken first by `migrate`'s transaction: concurrent migrations take
    /// turns, and the schema's notices are not sent to the client.
    pub migrate_lock: String,
    /// `events` and `record`: the events table and the schema-version
    /// record, as text, or NULL where missing.
    pub installed_tables: String,
    /// `version`: the schema-version record's (when the table exists).
    pub installed_version: String,
    /// `present`: whether `outbox_schema_applied` exists.
    pub applied_table: String,
    /// `fingerprint`: the schema text `migrate()` last applied (when the
    /// table exists).
    pub applied_fingerprint: String,
}

impl Queries {
    /// The statements for these table names.
    pub fn new(names: &TableNames) -> Self {
        let [events, attempts, inbox, relays] = names.main_four();
        let cursor = names.table("cursor_now");
        let cursor_states = names.table("cursor_states");
        let cursor_log = names.table("cursor_log");
        let leases = names.table("leases");
        let order = names.table("order");
        let lanes = names.table("lanes");
        let control = names.table("control");
        let function = |name: &str| names.table(name);
        let live_from = function("live_from");
        let kept_from = function("kept_from");
        let now = format!("{}()", function("now"));
        // Store time written into the statement, for the statements every
        // business transaction or consumed event runs: the same value as
        // `outbox_now()`, planned once with the prepared statement, without
        // a PL/pgSQL call and its own query (6-10 µs of a one-event
        // enqueue; BENCHMARKS.md, "The enqueue's store time and wake-up flag").
        let now_inline =
            format!("(now() + coalesce((SELECT clock_shift FROM {control}), interval '0'))");
        let seq = format!("{}{}_events_seq", names.qualifier(), names.prefix());
        let waiting = names.table("relay_waiting");
        // A requeue and a skip of the failed events `target` names,
        // returning `returning`.
        let requeue_of = |target: &str, returning: &str| {
            format!(
                "UPDATE {events} SET status = 4, blocks_key = FALSE, attempts = 0,
                     unfinished_claims = 0, suspect = FALSE, available_at = {now}
                 WHERE {target} AND status = 3 AND superseded_by IS NULL
                 RETURNING {returning}"
            )
        };
        let skip_of = |target: &str, returning: &str| {
            format!(
                "UPDATE {events} SET blocks_key = FALSE
                 WHERE {target} AND status = 3 AND superseded_by IS NULL
                 RETURNING {returning}"
            )
        };
        // The same on a set of events (`$1` an array), with their history
        // rows written by the same statement.
        let each = |update: String| {
            format!(
                "WITH done AS ({update}), recorded AS (
                     INSERT INTO {attempts} (event_id, kind, at, actor, error_class, detail, attempts)
                     SELECT event_id, $2, {now}, $3, NULL, $4, attempts FROM done)
                 SELECT event_id, partition_key FROM done"
            )
        };
        let (one, many) = (
            ("event_id = $1", "attempts, partition_key"),
            ("event_id = ANY($1)", "event_id, attempts, partition_key"),
        );
        let (requeue, skip) = (requeue_of(one.0, one.1), skip_of(one.0, one.1));
        let requeue_each = each(requeue_of(many.0, many.1));
        let skip_each = each(skip_of(many.0, many.1));
        Self {
            admin: AdminQueries {
                stats: format!(
                    "SELECT event_type, claimable, oldest, parked, in_flight, failed, now, blocked
                     FROM {}()",
                    function("stats")
                ),
                held_back: format!("SELECT * FROM {}()", function("held_back")),
                // The state as the core models it: in a live lease → in flight
                // (1); in a lane, not yet taken → pending (0); a stream row the
                // cursor passed or a claim took and acked → published (2), at
                // the time the cursor log says (to the second); tracked or
                // parked → pending (0).
                event_state: format!(
                    "WITH e AS (SELECT * FROM {events} WHERE event_id = $1),
                     c AS (SELECT * FROM {cursor}),
                     lease AS (
                         SELECT l.owner, l.expires_at FROM {leases} l, e
                         WHERE l.token >= {live_from}() AND cardinality(l.held) > 0
                           AND e.sequence = ANY(l.held) LIMIT 1
                     ), laned AS (
                         SELECT 1 AS laned FROM {lanes} l, e
                         WHERE e.status = 0 AND l.partition_key = e.partition_key
                           AND array_position(l.sequences, e.sequence) > l.taken
                         LIMIT 1
                     ), stream AS (
                         SELECT o.first_position + array_position(o.sequences, e.sequence) - 1 AS position
                         FROM {order} o, e
                         WHERE e.status = 0 AND int8range(o.lo_sequence, o.hi_sequence, '[]') @> e.sequence
                           AND e.sequence = ANY(o.sequences)
                         LIMIT 1
                     ), passed AS (
                         SELECT s.position FROM stream s, c
                         WHERE s.position < c.position
                            OR EXISTS (SELECT 1 FROM {leases} l
                                       WHERE l.token >= {kept_from}() AND s.position = ANY(l.positions))
                     )
                     SELECT CASE WHEN lease.owner IS NOT NULL THEN 1
                                 WHEN laned.laned IS NOT NULL THEN 0
                                 WHEN passed.position IS NOT NULL THEN 2
                                 WHEN e.status IN (0, 4, 5) THEN 0
                                 ELSE e.status END::int2 AS status,
                            e.available_at, e.attempts, lease.owner AS lease_owner,
                            lease.expires_at AS lease_expires_at,
                            CASE WHEN laned.laned IS NOT NULL THEN NULL
                                 WHEN passed.position IS NOT NULL
                                 THEN coalesce((SELECT g.at FROM {cursor_log} g
                                                WHERE g.position > passed.position
                                                ORDER BY g.position LIMIT 1), c.moved_at)
                                 ELSE e.published_at END AS published_at,
                            e.blocks_key, e.superseded_by
                     FROM e LEFT JOIN c ON TRUE
                     LEFT JOIN lease ON TRUE LEFT JOIN laned ON TRUE LEFT JOIN passed ON TRUE"
                ),
                failed_event: admin_queries::failed_event(names, EVENT_COLUMNS, "$1"),
                failed_events: admin_queries::FailedQueries::new(names, EVENT_COLUMNS, |n| {
                    format!("${n}")
                }),
                history: admin_queries::history(names, "$1"),
                blocked_keys: format!(
                    "SELECT partition_key, event_id, backlog FROM {}()",
                    function("blocked_keys")
                ),
                requeue,
                skip,
                relays: admin_queries::relays(names),
                last_sequence: admin_queries::last_sequence(names),
            },
            channel: channel(names),
            claim_lock: lock_key(&events),
            producer_lock: lock_key(&events) ^ 0x0b5e_55ed,
            // Sequences are taken in array order, so one transaction's
            // events keep their insert order. Store time fills created_at;
            // a delay (from the caller's available_at on its own clock)
            // counts from it. Store time is read once per statement: the
            // columns' defaults called the function twice per row (226,000
            // calls for a burst of 113,000 events, 1.5 s of server time).
            enqueue: format!(
                "WITH clock AS MATERIALIZED (SELECT {now_inline} AS at)
                 INSERT INTO {events} (sequence, event_id, aggregate_type, aggregate_id, event_type,
                     partition_key, payload, payload_version, headers, created_at, available_at)
                 SELECT s, event_id, aggregate_type, aggregate_id, event_type, partition_key,
                     payload::jsonb, payload_version, headers::jsonb, (SELECT at FROM clock),
                     (SELECT at FROM clock) + coalesce(delay_ms, 0) * interval '1 millisecond'
                 FROM (
                     SELECT nextval('{seq}') AS s, u.*
                     FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
                                 $6::text[], $7::int4[], $8::text[], $9::int8[])
                          WITH ORDINALITY AS u(event_id, aggregate_type, aggregate_id, event_type,
                                               partition_key, payload, payload_version, headers,
                                               delay_ms, n)
                     ORDER BY n
                 ) AS x
                 ON CONFLICT (event_id) DO NOTHING
                 RETURNING event_id, sequence"
            ),
            // One event per business transaction is the common enqueue:
            // as nine one-element arrays it cost the server their decoding
            // and the unnest, and the business transaction 3 % more
            // (BENCHMARKS.md, "The enqueue beside pgq.insert_event").
            enqueue_one: format!(
                "WITH clock AS MATERIALIZED (SELECT {now_inline} AS at)
                 INSERT INTO {events} (sequence, event_id, aggregate_type, aggregate_id, event_type,
                     partition_key, payload, payload_version, headers, created_at, available_at)
                 SELECT nextval('{seq}'), $1, $2, $3, $4, $5, $6::jsonb, $7, $8::jsonb,
                     c.at, c.at + coalesce($9, 0) * interval '1 millisecond'
                 FROM clock c
                 ON CONFLICT (event_id) DO NOTHING
                 RETURNING event_id, sequence"
            ),
            sync_clock: format!(
                "INSERT INTO {control} AS c (id, clock_shift) VALUES (TRUE, $1 * interval '1 microsecond')
                 ON CONFLICT (id) DO UPDATE SET clock_shift = EXCLUDED.clock_shift
                 WHERE c.clock_shift <> EXCLUDED.clock_shift"
            ),
            // The idle relay's one statement per poll: anything to claim?
            // With a wake-up attached it also (re)sets relay_waiting, and
            // says whether it had to (then a producer may have read the
            // flag just before: the wake-up looks again shortly).
            // The flag is a sequence (see the schema): set at once, seen by
            // every producer's trigger from then on, before this statement
            // commits.
            probe: format!(
                "SELECT {any}() AS anything,
                     CASE WHEN $1 AND pg_sequence_last_value('{waiting}') IS DISTINCT FROM 1
                          THEN setval('{waiting}', 1) = 1 ELSE FALSE END AS registered",
                any = function("anything_to_do"),
            ),
            watch_producers: format!(
                "SELECT in_flight, anything FROM {}($1)",
                function("watch_producers")
            ),
            stop_waiting: format!(
                "SELECT setval('{waiting}', 0) WHERE pg_sequence_last_value('{waiting}') = 1"
            ),
            claim: format!(
                "SELECT * FROM {}($1, $2, $3 * interval '1 millisecond', $4, $5, $6)",
                function("claim")
            ),
            // A claimed row that does not decode fails on its own, at once:
            // out of its lease, history kind Unreadable, never retried.
            fail_unreadable: format!(
                "WITH taken AS (
                     SELECT t.* FROM {take}($1, $2) AS t
                 ), failed AS (
                     UPDATE {events} e
                     SET status = 3, blocks_key = $3, position = coalesce(e.position, t.claim_position),
                         unfinished_claims = 0, suspect = FALSE
                     FROM taken t WHERE e.sequence = t.sequence
                     RETURNING e.sequence, e.event_id, e.attempts, e.partition_key, e.position,
                               t.owner, e.blocks_key
                 ), history AS (
                     INSERT INTO {attempts} (event_id, kind, at, actor, error_class, detail, attempts)
                     SELECT f.event_id, 'Unreadable', {now}, f.owner, NULL, r.reason, f.attempts
                     FROM failed f JOIN unnest($1::int8[], $4::text[]) AS r(sequence, reason)
                       ON r.sequence = f.sequence
                 ), parked AS (
                     UPDATE {events} p SET status = 5 FROM failed f
                     WHERE f.blocks_key AND p.partition_key = f.partition_key AND p.status = 4
                       AND p.position > f.position
                 )
                 SELECT sequence FROM failed",
                take = function("take"),
            ),
            ack: format!("SELECT {}($1, $2) AS sequence", function("ack")),
            nack: format!(
                "SELECT {}($1, $2, $3, $4, $5, $6, $7) AS sequence",
                function("nack")
            ),
            release: format!("SELECT {}($1, $2, $3) AS sequence", function("release")),
            heartbeat: format!(
                "INSERT INTO {relays} AS r (relay, last_seen, clock_skew_ms,
                     outage_since, outage_destination, outage_reason)
                 SELECT $1, n, (extract(epoch FROM ($2::timestamptz - n)) * 1000)::bigint,
                     CASE WHEN $3::text IS NULL THEN NULL ELSE n END, $3::text, $4::text
                 FROM (SELECT {now} AS n) AS t
                 ON CONFLICT (relay) DO UPDATE
                 SET last_seen = EXCLUDED.last_seen, clock_skew_ms = EXCLUDED.clock_skew_ms,
                     outage_since = CASE WHEN EXCLUDED.outage_destination IS NULL THEN NULL
                         ELSE coalesce(r.outage_since, EXCLUDED.outage_since) END,
                     outage_destination = EXCLUDED.outage_destination,
                     outage_reason = EXCLUDED.outage_reason"
            ),
            // Other sessions' transactions that inserted events and have
            // not ended: the holders of the producer lock the insert trigger
            // takes. Not "a write lock on the events table": relays and
            // purges take that too, and their own short transactions are
            // no producer's (they were listed as strangers).
            open_transactions: {
                let producer = lock_key(&events) ^ 0x0b5e_55ed;
                let (classid, objid) = ((producer as u64) >> 32, (producer as u64) & 0xffff_ffff);
                format!(
                    "SELECT a.pid::int8 AS pid, coalesce(a.datname::text, '') AS database,
                            a.xact_start, coalesce(a.state, '') AS state, a.query_start
                     FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                     WHERE l.locktype = 'advisory' AND l.granted
                       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                       AND l.classid = {classid} AND l.objid = {objid} AND l.objsubid = 1
                       AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL
                     ORDER BY a.xact_start"
                )
            },
            history_many: format!(
                "SELECT event_id, kind, at, actor, error_class, detail, attempts
                 FROM {attempts} WHERE event_id = ANY($1) ORDER BY id"
            ),
            supersede_lock: format!(
                "SELECT position, attempts, partition_key FROM {events}
                 WHERE event_id = $1 AND status = 3 AND superseded_by IS NULL FOR UPDATE"
            ),
            // The replacement takes the failed row's claim position, outside
            // the stream (status 4): no tick appends it again.
            supersede_insert: format!(
                "INSERT INTO {events} (position, event_id, aggregate_type, aggregate_id,
                     event_type, partition_key, payload, payload_version, headers, available_at,
                     status, txid)
                 VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9::jsonb,
                         {now} + coalesce($10, 0) * interval '1 millisecond', 4, '0')
                 ON CONFLICT (event_id) DO NOTHING
                 RETURNING sequence"
            ),
            supersede_mark: format!(
                "UPDATE {events} SET blocks_key = FALSE, superseded_by = $2 WHERE event_id = $1"
            ),
            requeue_each,
            skip_each,
            // Once nothing blocks a key of `$1`, rows parked behind it are
            // tracked again (claimed in their order).
            unpark_keys: format!(
                "UPDATE {events} e SET status = 4
                 WHERE e.partition_key = ANY($1) AND e.status = 5
                   AND NOT EXISTS (SELECT 1 FROM {events} b
                                   WHERE b.partition_key = e.partition_key AND b.status = 3
                                     AND b.blocks_key)"
            ),
            record: format!(
                "INSERT INTO {attempts} (event_id, kind, at, actor, error_class, detail, attempts)
                 VALUES ($1, $2, {now}, $3, NULL, $4, $5)"
            ),
            // Published rows at least a second older than the cutoff: rows
            // written published, then stream rows of runs the cursor had
            // passed by then (the cursor log), neither in flight nor in a
            // lane (set aside as the cursor passed), walked in claim order until
            // the batch is full. A call returns fewer than `$2` only when it
            // walked every such run, so "call again while it returns the
            // batch size" empties the history (a cap on runs read, whatever
            // their size, made it stop after one call: runs hold 1 to 64
            // rows). Runs the walk emptied go with their rows; each run is
            // walked whole once more at most (it keeps a row in flight).
            purge: format!(
                "WITH cutoff AS (SELECT {now} - $1 * interval '1 millisecond' AS at),
                 bound AS (
                     -- The log has an entry a second at most; the cursor's
                     -- recent states say where it was since.
                     SELECT greatest(
                         (SELECT g.position FROM {cursor_log} g, cutoff
                          WHERE g.at <= cutoff.at - interval '1 second'
                          ORDER BY g.position DESC LIMIT 1),
                         (SELECT c.position FROM {cursor_states} c, cutoff
                          WHERE c.moved_at <= cutoff.at - interval '1 second'
                          ORDER BY c.id DESC LIMIT 1)) AS position
                 ), held AS (
                     SELECT unnest(held) AS sequence FROM {leases}
                     WHERE token >= {live_from}() AND cardinality(held) > 0
                 ), laned AS (
                     SELECT unnest(sequences[taken + 1 :]) AS sequence FROM {lanes}
                 ), written AS (
                     SELECT e.sequence FROM {events} e, cutoff
                     WHERE e.status = 2 AND e.published_at <= cutoff.at
                     ORDER BY e.published_at LIMIT $2
                 ), streamed AS MATERIALIZED (
                     SELECT r.first_position, e.sequence
                     FROM (SELECT o.first_position, o.sequences FROM {order} o, bound b
                           WHERE o.first_position < b.position
                             AND o.first_position + cardinality(o.sequences) <= b.position
                           ORDER BY o.first_position) r
                     CROSS JOIN LATERAL unnest(r.sequences) AS u(sequence)
                     CROSS JOIN LATERAL (SELECT x.sequence FROM {events} x
                                         WHERE x.sequence = u.sequence AND x.status = 0
                                         LIMIT 1) e
                     WHERE e.sequence NOT IN (SELECT sequence FROM held)
                       AND e.sequence NOT IN (SELECT sequence FROM laned)
                     LIMIT greatest($2 - (SELECT count(*) FROM written), 0)
                 ), picked AS (
                     SELECT sequence FROM written UNION ALL SELECT sequence FROM streamed
                 ), walked AS (
                     -- How far the walk went: to the bound when it ran out
                     -- of rows, else up to the run of its last row.
                     SELECT CASE WHEN (SELECT count(*) FROM streamed)
                                      < greatest($2 - (SELECT count(*) FROM written), 0)
                                 THEN (SELECT position FROM bound)
                                 ELSE (SELECT max(first_position) + 1 FROM streamed) END AS position
                 ), doomed AS (
                     DELETE FROM {events} WHERE sequence IN (SELECT sequence FROM picked)
                     RETURNING sequence, event_id
                 ), history AS (
                     DELETE FROM {attempts} WHERE event_id IN (SELECT event_id FROM doomed)
                 ), emptied AS (
                     -- A run whose stream rows are all gone has no use left
                     -- (rows that left the stream keep their own position).
                     DELETE FROM {order} o USING walked w, bound b
                     WHERE o.first_position < w.position
                       AND o.first_position + cardinality(o.sequences) <= b.position
                       AND NOT EXISTS (
                           SELECT 1 FROM unnest(o.sequences) AS u(sequence)
                           CROSS JOIN LATERAL (SELECT 1 FROM {events} x
                                               WHERE x.sequence = u.sequence AND x.status = 0
                                               LIMIT 1) e
                           WHERE u.sequence NOT IN (SELECT sequence FROM doomed))
                 )
                 SELECT count(*) FROM doomed"
            ),
            // Once no run is left before it, a log entry has no use.
            prune_cursor_log: format!(
                "DELETE FROM {cursor_log} g
                 WHERE g.position < coalesce((SELECT min(first_position) FROM {order}), 0)
                   AND g.position < (SELECT max(position) FROM {cursor_log})"
            ),
            inbox_claim: format!(
                "INSERT INTO {inbox} (consumer, event_id, claimed_at) VALUES ($1, $2, {now_inline})
                 ON CONFLICT (consumer, event_id) DO NOTHING"
            ),
            inbox_purge: format!(
                "DELETE FROM {inbox} WHERE (consumer, event_id) IN (
                     SELECT consumer, event_id FROM {inbox}
                     WHERE claimed_at <= {now} - $1 * interval '1 millisecond' LIMIT $2)"
            ),
            migrate_lock: format!(
                "SELECT pg_advisory_xact_lock({}), \
                 set_config('client_min_messages', 'warning', true)",
                lock_key(&events) ^ 0x5eed
            ),
            installed_tables: format!(
                "SELECT to_regclass('{events}')::text AS events, \
                 to_regclass('{record}')::text AS record",
                record = names.table("schema_version")
            ),
            applied_table: format!(
                "SELECT to_regclass('{}') IS NOT NULL AS present",
                names.table("schema_applied")
            ),
            applied_fingerprint: format!(
                "SELECT max(fingerprint) AS fingerprint FROM {}",
                names.table("schema_applied")
            ),
            installed_version: format!(
                "SELECT MAX(version) AS version FROM {}",
                names.table("schema_version")
            ),
        }
    }
}

/// The NOTIFY channel: one per set of tables (schema and prefix), at most
/// 63 bytes as PostgreSQL requires.
fn channel(names: &TableNames) -> String {
    let mut channel = match names.schema() {
        Some(schema) => format!("{schema}_{}_events", names.prefix()),
        None => format!("{}_events", names.prefix()),
    };
    channel.truncate(63);
    channel
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
    fn lock_keys_differ_per_table() {
        assert_ne!(lock_key("a_events"), lock_key("b_events"));
        assert_eq!(lock_key("a_events"), lock_key("a_events"));
    }

    #[test]
    fn channels_are_per_schema_and_fit() {
        let plain = TableNames::default();
        let other = TableNames::default().in_schema("billing").unwrap();
        assert_ne!(channel(&plain), channel(&other));
        let long = TableNames::with_prefix(&"p".repeat(40))
            .unwrap()
            .in_schema(&"s".repeat(63))
            .unwrap();
        assert_eq!(channel(&long).len(), 63);
    }
}
