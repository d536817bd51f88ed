-- Stream rows the cursor has not passed and no claim took (pending in
-- claim order), lane rows not yet taken, and committed rows no tick has
-- ordered yet: together with the tracked rows, every pending event,
-- however the table got here.
-- Admin reads build on it, so it costs what is waiting, never what is
-- retained: published stream rows stay status 0 until purged, so rows not
-- yet ticked are found by transaction id (the two probes a tick makes),
-- never by status. Planned for indexes whatever the statistics say (a
-- history loaded since the last ANALYZE looked empty to the planner).
CREATE OR REPLACE FUNCTION {{schema}}outbox_stream_pending() RETURNS SETOF bigint
    LANGUAGE plpgsql STABLE SET jit = off SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0 AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM {{schema}}outbox_cursor_now;
    RETURN QUERY
        WITH taken AS (
            SELECT unnest(l.positions) AS position FROM {{schema}}outbox_leases l
            WHERE l.token >= c.kept_from AND l.max_position >= c.position
        ), held AS (
            SELECT unnest(held) AS sequence FROM {{schema}}outbox_leases
            WHERE token >= c.live_from AND cardinality(held) > 0
        )
        SELECT u.sequence
        FROM {{schema}}outbox_order o
        CROSS JOIN LATERAL unnest(o.sequences) WITH ORDINALITY AS u(sequence, i)
        WHERE o.first_position >= (SELECT coalesce(max(first_position), 0) FROM {{schema}}outbox_order
                                   WHERE first_position <= c.position)
          AND o.first_position + u.i - 1 >= c.position
          AND o.first_position + u.i - 1 NOT IN (SELECT position FROM taken)
          AND u.sequence NOT IN (SELECT sequence FROM held);
    -- A lane row leased is out of its lane (in the same transaction).
    RETURN QUERY
        SELECT unnest(l.sequences[l.taken + 1 :]) FROM {{schema}}outbox_lanes l;
    IF c.tick_snapshot IS NOT NULL
       AND c.system_identifier = (SELECT system_identifier FROM pg_control_system()) THEN
        RETURN QUERY
            SELECT e.sequence FROM {{schema}}outbox_events e
            WHERE e.txid >= pg_snapshot_xmax(c.tick_snapshot) AND e.status = 0 AND e.position IS NULL;
        RETURN QUERY
            SELECT e.sequence
            FROM (SELECT x.id FROM pg_snapshot_xip(c.tick_snapshot) AS x(id) OFFSET 0) x
            CROSS JOIN LATERAL (SELECT y.sequence FROM {{schema}}outbox_events y
                                WHERE y.txid = x.id AND y.status = 0 AND y.position IS NULL
                                OFFSET 0) e;
    ELSE
        -- Never ticked, or on another cluster: every stream row not in
        -- claim order (the next claim rebases; until then this reads the
        -- table once).
        RETURN QUERY
            SELECT e.sequence FROM {{schema}}outbox_events e
            WHERE e.status = 0 AND e.position IS NULL
              AND NOT EXISTS (SELECT 1 FROM {{schema}}outbox_order o
                              WHERE int8range(o.lo_sequence, o.hi_sequence, '[]') @> e.sequence
                                AND e.sequence = ANY(o.sequences));
    END IF;
END
$$;

-- Per event type: claimable (pending and due), the oldest claimable,
-- parked (pending, not yet due), in flight, failed. Reads the backlog,
-- the leases and the failed rows by index, never the retained history;
-- `stats()`, `status`, health checks and every metrics scrape run it.
-- Pending rows of a key blocked by a failed row count as blocked, not as
-- claimable or parked (nor in the lag): they wait for an operator. Every
-- pending row of such a key is behind its failed row (per-key order let
-- nothing of the key past it), the rows `outbox_blocked_keys` counts.
-- Failed rows are counted apart, per type from their own index: a
-- million of them cost a count, not a million rows through the
-- classification of the waiting ones.
-- The return type grew a column: dropped first (CREATE OR REPLACE cannot
-- change it), in the same transaction as the CREATE.
DROP FUNCTION IF EXISTS {{schema}}outbox_stats();
CREATE FUNCTION {{schema}}outbox_stats()
    RETURNS TABLE (event_type text, claimable bigint, oldest timestamptz, parked bigint,
                   in_flight bigint, failed bigint, now timestamptz, blocked bigint)
    LANGUAGE sql STABLE SET jit = off SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0 AS $$
    WITH held AS (
        SELECT unnest(held) AS sequence FROM {{schema}}outbox_leases
        WHERE token >= {{schema}}outbox_live_from() AND cardinality(held) > 0
    ), blocked_keys AS (
        SELECT DISTINCT b.partition_key FROM {{schema}}outbox_events b
        WHERE b.status = 3 AND b.blocks_key
    ), open AS (
        SELECT e.event_type, e.partition_key, e.status, e.available_at, FALSE AS in_flight
        FROM {{schema}}outbox_stream_pending() AS p(sequence)
        CROSS JOIN LATERAL (SELECT x.event_type, x.partition_key, x.status, x.available_at
                            FROM {{schema}}outbox_events x
                            WHERE x.sequence = p.sequence AND x.status = 0 LIMIT 1) e
        UNION ALL
        SELECT e.event_type, e.partition_key, e.status, e.available_at, TRUE
        FROM held h
        CROSS JOIN LATERAL (SELECT x.event_type, x.partition_key, x.status, x.available_at
                            FROM {{schema}}outbox_events x WHERE x.sequence = h.sequence LIMIT 1) e
        UNION ALL
        SELECT e.event_type, e.partition_key, e.status, e.available_at, FALSE
        FROM {{schema}}outbox_events e
        WHERE e.status IN (4, 5) AND e.sequence NOT IN (SELECT sequence FROM held)
    ), classified AS MATERIALIZED (
        -- Materialized: each row's blocked flag is asked once, not once per
        -- count that reads it (four hashed lookups a row, 68 ms to 41
        -- beside 10,000 blocked keys).
        SELECT o.*, o.status <> 3 AND NOT o.in_flight
                    AND o.partition_key IN (SELECT partition_key FROM blocked_keys) AS blocked
        FROM open o
    ), now AS (SELECT {{schema}}outbox_now() AS at
    ), waiting AS (
        SELECT o.event_type,
            count(*) FILTER (WHERE o.status <> 3 AND NOT o.in_flight AND NOT o.blocked
                             AND o.available_at <= now.at) AS claimable,
            min(o.available_at) FILTER (WHERE o.status <> 3 AND NOT o.in_flight AND NOT o.blocked
                                        AND o.available_at <= now.at) AS oldest,
            count(*) FILTER (WHERE o.status <> 3 AND NOT o.in_flight AND NOT o.blocked
                             AND o.available_at > now.at) AS parked,
            count(*) FILTER (WHERE o.in_flight) AS in_flight,
            count(*) FILTER (WHERE o.status = 3) AS failed_in_flight,
            count(*) FILTER (WHERE o.blocked) AS blocked
        FROM classified o, now GROUP BY o.event_type
    ), failed AS (
        SELECT f.event_type, count(*) AS failed FROM {{schema}}outbox_events f
        WHERE f.status = 3 GROUP BY f.event_type
    )
    SELECT coalesce(w.event_type, f.event_type),
           coalesce(w.claimable, 0), w.oldest, coalesce(w.parked, 0), coalesce(w.in_flight, 0),
           coalesce(w.failed_in_flight, 0) + coalesce(f.failed, 0),
           (SELECT at FROM now), coalesce(w.blocked, 0)
    FROM waiting w FULL JOIN failed f ON f.event_type = w.event_type
    ORDER BY 1
$$;

-- Keys parked behind a failed row that blocks them: the first such row
-- and how many pending events wait behind it (tracked, parked, and stream
-- rows not yet visited by a claim). The same count `outbox_held_back`
-- reports, so `status` never contradicts itself.
CREATE OR REPLACE FUNCTION {{schema}}outbox_blocked_keys()
    RETURNS TABLE (partition_key text, event_id uuid, backlog bigint)
    LANGUAGE sql STABLE SET jit = off SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0 AS $$
    WITH blocked AS (
        SELECT DISTINCT ON (b.partition_key) b.partition_key, b.event_id
        FROM {{schema}}outbox_events b WHERE b.status = 3 AND b.blocks_key
        ORDER BY b.partition_key, b.position
    ), stream_keys AS MATERIALIZED (
        -- Counted per key first, then matched to the blocked keys once:
        -- asked of each row, the blocked keys were hashed again for every
        -- stream row (10,000 blocked keys, 100,000 stream rows: 81 s).
        SELECT e.partition_key, count(*) AS n
        FROM {{schema}}outbox_stream_pending() AS p(sequence)
        CROSS JOIN LATERAL (SELECT x.partition_key FROM {{schema}}outbox_events x
                            WHERE x.sequence = p.sequence AND x.status = 0 LIMIT 1) e
        GROUP BY e.partition_key
    ), waiting AS (
        SELECT k.partition_key, k.n FROM stream_keys k JOIN blocked b USING (partition_key)
        UNION ALL
        -- Tracked and parked rows counted per key in one pass over their
        -- index, then matched to the blocked keys: a count per blocked key
        -- cost 10,000 probes beside 10,000 blocked keys (86 ms of `status`
        -- to 44).
        SELECT y.partition_key, count(*) AS n FROM {{schema}}outbox_events y
        WHERE y.status IN (4, 5) AND y.partition_key IN (SELECT partition_key FROM blocked)
        GROUP BY y.partition_key
    ), counted AS (
        SELECT partition_key, sum(n)::bigint AS backlog FROM waiting GROUP BY partition_key
    )
    SELECT b.partition_key, b.event_id, coalesce(c.backlog, 0)
    FROM blocked b LEFT JOIN counted c ON c.partition_key = b.partition_key
    ORDER BY b.partition_key
$$;

-- What holds publication back, in one row (`held_back()`, `status`).
CREATE OR REPLACE FUNCTION {{schema}}outbox_held_back()
    RETURNS TABLE (blocked_keys bigint, blocked_waiting bigint, backoff_keys bigint,
                   backoff_waiting bigint, next_due timestamptz, expired_leases bigint,
                   expired_events bigint, first_expired_at timestamptz, long_owners text[],
                   long_events bigint, long_claimed_at timestamptz, long_expires_at timestamptz,
                   suspects bigint)
    LANGUAGE sql STABLE SET jit = off SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0 AS $$
    WITH now AS (SELECT {{schema}}outbox_now() AS at),
    blocked AS (SELECT * FROM {{schema}}outbox_blocked_keys()),
    held AS (
        SELECT unnest(held) AS sequence FROM {{schema}}outbox_leases
        WHERE token >= {{schema}}outbox_live_from() AND cardinality(held) > 0
    ),
    -- Every pending row not in flight: stream rows no claim took (a delayed
    -- event waits there until a claim meets it), tracked and parked rows.
    pending AS (
        SELECT x.partition_key, x.available_at
        FROM {{schema}}outbox_stream_pending() AS p(sequence)
        CROSS JOIN LATERAL (SELECT y.partition_key, y.available_at FROM {{schema}}outbox_events y
                            WHERE y.sequence = p.sequence AND y.status = 0 LIMIT 1) x
        UNION ALL
        SELECT e.partition_key, e.available_at FROM {{schema}}outbox_events e
        WHERE e.status IN (4, 5) AND e.sequence NOT IN (SELECT sequence FROM held)
    ),
    -- Keys waiting on a retry backoff or a requested delay; the events
    -- behind them (due or not) wait too.
    backoff AS (
        SELECT p.partition_key, min(p.available_at) AS due FROM pending p, now
        WHERE p.available_at > now.at GROUP BY p.partition_key
    ), expired AS (
        SELECT l.* FROM {{schema}}outbox_leases l, now
        WHERE l.token >= {{schema}}outbox_live_from()
          AND l.expires_at <= now.at AND cardinality(l.held) > 0
    ), long AS (
        SELECT l.* FROM {{schema}}outbox_leases l, now
        WHERE l.token >= {{schema}}outbox_live_from() AND l.expires_at > now.at AND l.claimed_at < now.at - interval '5 seconds'
          AND cardinality(l.held) > 0
    )
    SELECT
        (SELECT count(*) FROM blocked),
        (SELECT coalesce(sum(backlog), 0)::bigint FROM blocked),
        (SELECT count(*) FROM backoff),
        (SELECT count(*) FROM pending p WHERE p.partition_key IN (SELECT partition_key FROM backoff)),
        (SELECT min(due) FROM backoff),
        (SELECT count(*) FROM expired),
        (SELECT coalesce(sum(cardinality(held)), 0)::bigint FROM expired),
        (SELECT min(expires_at) FROM expired),
        (SELECT array_agg(DISTINCT owner) FROM long),
        (SELECT coalesce(sum(cardinality(held)), 0)::bigint FROM long),
        (SELECT min(claimed_at) FROM long),
        (SELECT min(expires_at) FROM long),
        (SELECT count(*) FROM {{schema}}outbox_events WHERE status = 4 AND suspect)
$$;

-- Sequences travel neither with logical replication nor with every copy
-- of a database: bring each past the rows it numbered, so producers and
-- claims on a new primary never collide with rows that came with the data.
-- Each sequence is read by name alone: scanning pg_sequences would look up
-- every sequence of the database, and fail ("schema … does not exist")
-- when another session drops one of them meanwhile.
CREATE OR REPLACE FUNCTION {{schema}}outbox_sequences_past_rows() RETURNS void
    LANGUAGE sql AS $$
    SELECT setval('{{schema}}outbox_events_seq', x.m)
    FROM (SELECT max(sequence) AS m FROM {{schema}}outbox_events) x, {{schema}}outbox_events_seq s
    WHERE x.m > s.last_value;
    SELECT setval(pg_get_serial_sequence('{{schema}}outbox_leases', 'token'), x.m)
    FROM (SELECT max(token) AS m FROM {{schema}}outbox_leases) x
    WHERE x.m > coalesce(pg_sequence_last_value(
                     pg_get_serial_sequence('{{schema}}outbox_leases', 'token')::regclass), 0);
    SELECT setval(pg_get_serial_sequence('{{schema}}outbox_attempts', 'id'), x.m)
    FROM (SELECT max(id) AS m FROM {{schema}}outbox_attempts) x
    WHERE x.m > coalesce(pg_sequence_last_value(
                     pg_get_serial_sequence('{{schema}}outbox_attempts', 'id')::regclass), 0);
    SELECT setval(pg_get_serial_sequence('{{schema}}outbox_cursor_states', 'id'), x.m)
    FROM (SELECT max(id) AS m FROM {{schema}}outbox_cursor_states) x
    WHERE x.m > coalesce(pg_sequence_last_value(
                     pg_get_serial_sequence('{{schema}}outbox_cursor_states', 'id')::regclass), 0);
$$;
SELECT {{schema}}outbox_sequences_past_rows();

-- Applied: what the next migrate() compares against.
DELETE FROM {{schema}}outbox_schema_applied;
INSERT INTO {{schema}}outbox_schema_applied (fingerprint) VALUES ('{{fingerprint}}');
