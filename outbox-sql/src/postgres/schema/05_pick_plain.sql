-- Whether one of `p_keys` waits outside the stream: a tracked row or a
-- blocking row of the key (its parked rows are behind the latter). The
-- plain pick gives way to the general one for those keys only where it
-- decides (see outbox_pick_plain).
CREATE OR REPLACE FUNCTION {{schema}}outbox_keys_wait(p_keys text[]) RETURNS boolean
    LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM unnest(p_keys) AS k(key)
                   WHERE EXISTS (SELECT 1 FROM {{schema}}outbox_events e
                                 WHERE e.partition_key = k.key AND (e.status = 4 OR e.blocks_key)))
$$;

-- The pick in the common case, with the stream rows read once: nothing
-- waits outside the stream but lanes (no tracked, parked or blocking row;
-- no lane at all for unordered claims) and every row of the window is
-- due. Then the general pick's tracked rows, late rows and suspects are
-- all empty, and what it decides comes down to: the first lane rows of
-- keys not in flight (a hot key between its batches) with the window's
-- rows of keys not in flight (per-key; a burst's key last), or the
-- window's first rows (unordered), and the rows before the cut not picked,
-- which hold the cursor or go into their lanes exactly as there. The
-- general pick handles every row of a window in ten passes (1,250 rows:
-- 14 ms of a claim's 27 on two cores, the PgQ profile of BENCHMARKS.md);
-- this one builds the window's rows once and asks little more of them.
-- Returns `stop` NULL and writes nothing when the case is not this one:
-- the claim asks outbox_pick. The tests `the_plain_pick_decides_as_the_
-- general_one_*` compare the two on the same states.
CREATE OR REPLACE FUNCTION {{schema}}outbox_pick_plain(
    p_now timestamptz, p_from bigint, p_to bigint, p_limit integer, p_ordered boolean,
    p_defer_young boolean,
    OUT sequences bigint[], OUT positions bigint[], OUT from_stream boolean[],
    OUT keys text[], OUT suspect bigint, OUT stop bigint, OUT deferred_positions bigint[],
    OUT deferring boolean, OUT dominated boolean)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_live_keys text[];
    v_lane_keys text[];
    v_lanes     bigint[];
    v_taken     integer[];
BEGIN
    -- Whether this is the case, asked first and cheaply: a key blocked
    -- for days must not cost every claim a plain pick thrown away. Asked
    -- again in the statement below, on its own snapshot: a settlement may
    -- commit between the two (a nack writing a tracked row, an ack ending
    -- a lease), and the pick must decide on one state of the tables.
    -- Rows waiting outside the stream leave this case only where they
    -- can matter to this claim (as in outbox_pick's waiting_keys): a
    -- tracked row due now (asked here), or a key of the window or of a
    -- ready lane that waits (asked by the statements below). Keys blocked
    -- for days, delayed events and retries backing off elsewhere leave
    -- claims here (`outbox-bench claim`, BENCHMARKS.md).
    IF EXISTS (SELECT 1 FROM {{schema}}outbox_events e
               WHERE e.status = 4 AND e.available_at <= p_now) THEN
        RETURN;
    END IF;
    v_live_keys := ARRAY(SELECT DISTINCT unnest(l.keys) FROM {{schema}}outbox_leases l
                         WHERE p_ordered AND l.token >= {{schema}}outbox_live_from()
                           AND cardinality(l.held) > 0);
    -- Lanes are taken here only by per-key claims (an unordered claim
    -- takes every key's lanes, in claim order: the general pick's way).
    IF NOT p_ordered AND EXISTS (SELECT 1 FROM {{schema}}outbox_lanes) THEN
        RETURN;
    END IF;
    -- Whether every row is due is asked of the runs the window touches: a
    -- row not due in any of them sends the claim to the general pick.
    IF EXISTS (SELECT 1 FROM {{schema}}outbox_window_runs(p_from, p_to) o
               WHERE NOT p_now >= ALL (o.available_at)) THEN
        RETURN;
    END IF;
    -- Keys that wait matter only where the pick decides: the rows up to
    -- its cut (picked, or left out before it), and the keys of ready
    -- lanes. The statements below ask that of their own snapshot; it is
    -- not asked here first as well. Beside 10,000 keys backing off
    -- elsewhere, the window's 257 keys cost 0.7 ms of index probes each
    -- time they are asked (auto_explain, `outbox-bench claim`'s
    -- `retrying-10k`), and a window whose keys wait is short-lived: the
    -- general pick that follows sets their rows aside.
    --
    -- Nothing in flight from the window on (no live key; no position
    -- beyond the cursor that a claim took or set aside): nothing is held or
    -- set aside, the stream is whole, and the picks are the window's first
    -- rows. Read as the runs' rows in order, without the stages below: a
    -- one-key drain claims this way every time (a quarter of the plain
    -- pick's time, 0.45 ms of a 1,000-event claim: BENCHMARKS.md, "third
    -- cut"). Decided again inside the statement, on its own snapshot, as
    -- the statement below does. The window's `runs` are read as there.
    IF cardinality(v_live_keys) = 0
       AND NOT EXISTS (SELECT 1 FROM {{schema}}outbox_lanes z WHERE z.ready_at <= p_now)
       AND NOT EXISTS (SELECT 1 FROM {{schema}}outbox_leases
                       WHERE token >= {{schema}}outbox_kept_from() AND max_position >= p_from) THEN
        WITH runs AS MATERIALIZED (
            SELECT o.first_position, o.sequences, o.keys, p_now >= ALL (o.available_at) AS due
            FROM {{schema}}outbox_window_runs(p_from, p_to) o
        ), firsts AS MATERIALIZED (
            -- One row past the batch: where the cursor stops after a full one.
            SELECT r.first_position + u.i - 1 AS position, u.sequence, u.partition_key
            FROM runs r
            CROSS JOIN LATERAL unnest(r.sequences, r.keys) WITH ORDINALITY AS u(sequence, partition_key, i)
            WHERE r.first_position + u.i - 1 >= p_from AND r.first_position + u.i - 1 < p_to
            ORDER BY 1 LIMIT p_limit + 1
        ), applies AS MATERIALIZED (
            SELECT NOT EXISTS (SELECT 1 FROM {{schema}}outbox_events e
                               WHERE e.status = 4 AND e.available_at <= p_now)
               AND (NOT p_ordered
                    OR NOT EXISTS (SELECT 1 FROM {{schema}}outbox_events e
                                   WHERE e.status = 4 OR e.blocks_key)
                    OR NOT {{schema}}outbox_keys_wait(ARRAY(SELECT DISTINCT f.partition_key
                                                             FROM firsts f)))
               AND NOT EXISTS (SELECT 1 FROM {{schema}}outbox_lanes z WHERE z.ready_at <= p_now)
               AND (p_ordered OR NOT EXISTS (SELECT 1 FROM {{schema}}outbox_lanes))
               AND NOT EXISTS (SELECT 1 FROM {{schema}}outbox_leases l
                               WHERE p_ordered AND l.token >= {{schema}}outbox_live_from()
                                 AND cardinality(l.held) > 0 AND cardinality(l.keys) > 0)
               AND NOT EXISTS (SELECT 1 FROM {{schema}}outbox_leases
                               WHERE token >= {{schema}}outbox_kept_from() AND max_position >= p_from)
               AND coalesce((SELECT bool_and(due) FROM runs), TRUE) AS ok
        ), picked AS MATERIALIZED (
            SELECT array_agg(f.sequence ORDER BY f.position) AS sequences,
                   array_agg(f.position ORDER BY f.position) AS positions,
                   array_agg(DISTINCT f.partition_key) AS keys, count(*) AS n,
                   max(f.position) AS last
            FROM (SELECT * FROM firsts ORDER BY position LIMIT p_limit) f
        )
        SELECT p.sequences, p.positions,
               CASE WHEN p.n > 0 THEN array_fill(TRUE, ARRAY[p.n::integer]) END,
               p.keys, NULL::bigint,
               CASE WHEN a.ok THEN
                   least(CASE WHEN p.n >= p_limit THEN
                             (SELECT min(f.position) FROM firsts f WHERE f.position > p.last) END,
                         p_to) END,
               NULL::bigint[],
               -- outbox_pick's `defer` with no key in flight: a window
               -- dominated by young keys needs keys in flight.
               CASE WHEN NOT p_ordered THEN FALSE
                    WHEN p_defer_young THEN TRUE
                    WHEN p.n > 0 THEN FALSE
                    ELSE EXISTS (SELECT 1 FROM (SELECT o.keys FROM {{schema}}outbox_order o
                                                ORDER BY o.first_position DESC LIMIT 4) o
                                 CROSS JOIN LATERAL unnest(o.keys) AS k(key)) END,
               FALSE
        FROM picked p, applies a
        INTO sequences, positions, from_stream, keys, suspect, stop, deferred_positions, deferring,
             dominated;
        RETURN;
    END IF;
    -- The window's rows (in flight or not), and the lanes of keys not in
    -- flight (a hot key's rows set aside while its batch was): picked as
    -- the general pick picks them when nothing else waits outside the
    -- stream, its tracked rows, late rows and suspects all empty.
    WITH live_leases AS MATERIALIZED (
        SELECT l.keys, l.claimed_at FROM {{schema}}outbox_leases l
        WHERE p_ordered AND l.token >= {{schema}}outbox_live_from() AND cardinality(l.held) > 0
    ), live_keys AS MATERIALIZED (
        SELECT DISTINCT unnest(keys) AS key FROM live_leases
    ), young_keys AS MATERIALIZED (
        SELECT DISTINCT unnest(keys) AS key FROM live_leases
        WHERE claimed_at > p_now - interval '1 second'
    ), taken AS (
        SELECT unnest(positions) AS position FROM {{schema}}outbox_leases
        WHERE token >= {{schema}}outbox_kept_from() AND max_position >= p_from
    ), runs AS MATERIALIZED (
        SELECT o.first_position, o.sequences, o.keys, p_now >= ALL (o.available_at) AS due
        FROM {{schema}}outbox_window_runs(p_from, p_to) o
    ), stream AS MATERIALIZED (
        SELECT w.position, w.sequence, w.partition_key,
               w.partition_key IN (SELECT key FROM live_keys) AS live
        FROM (SELECT r.first_position + u.i - 1 AS position, u.sequence, u.partition_key
              FROM runs r
              CROSS JOIN LATERAL unnest(r.sequences, r.keys) WITH ORDINALITY
                  AS u(sequence, partition_key, i)) w
        WHERE w.position >= p_from AND w.position < p_to
          AND w.position NOT IN (SELECT position FROM taken)
    ), facts AS MATERIALIZED (
        -- One pass for what the rest asks of the whole window.
        SELECT count(*) AS n, coalesce(bool_or(live), FALSE) AS any_live FROM stream
    ), lane_keys AS MATERIALIZED (
        -- As in outbox_pick: keys with lane rows ready, not in flight, and
        -- whether one of their entries holds a burst.
        SELECT partition_key, bool_or(size - taken >= 64) AS burst
        FROM {{schema}}outbox_lanes
        WHERE p_ordered AND ready_at <= p_now AND partition_key NOT IN (SELECT key FROM live_keys)
        GROUP BY partition_key
    ), lane_rows AS MATERIALIZED (
        -- Per such key its first lane rows.
        SELECT x.* FROM lane_keys t CROSS JOIN LATERAL (
            SELECT h.sequence, t.partition_key, h.claim_position AS position, h.lane, h.lane_index
            FROM {{schema}}outbox_lane_head(t.partition_key, p_limit) h
            ORDER BY h.claim_position LIMIT p_limit
        ) x
    ), picks AS MATERIALIZED (
        -- outbox_pick's order: keys with a burst set aside fill what the
        -- others leave of the batch.
        SELECT c.* FROM (
            SELECT s.position, s.sequence, s.partition_key, NULL::bigint AS lane,
                   NULL::integer AS lane_index
            FROM stream s WHERE NOT s.live
            UNION ALL
            SELECT position, sequence, partition_key, lane, lane_index FROM lane_rows
        ) c
        ORDER BY c.partition_key IN (SELECT partition_key FROM lane_keys WHERE burst), c.position
        LIMIT p_limit
    ), picked AS MATERIALIZED (
        SELECT array_agg(sequence ORDER BY position) AS sequences,
               array_agg(position ORDER BY position) AS positions,
               array_agg(DISTINCT partition_key) AS keys, count(*) AS n,
               CASE WHEN count(*) >= p_limit THEN max(position) END AS cut
        FROM picks
    ), applies AS MATERIALIZED (
        -- Keys that wait matter only up to the cut (see above).
        SELECT NOT EXISTS (SELECT 1 FROM {{schema}}outbox_events e
                           WHERE e.status = 4 AND e.available_at <= p_now)
           AND (NOT p_ordered
                OR NOT EXISTS (SELECT 1 FROM {{schema}}outbox_events e
                               WHERE e.status = 4 OR e.blocks_key)
                OR NOT {{schema}}outbox_keys_wait(ARRAY(
                       SELECT s.partition_key FROM stream s
                       WHERE s.position <= coalesce((SELECT cut FROM picked), p_to)
                       UNION
                       SELECT partition_key FROM lane_keys)))
           AND NOT (NOT p_ordered AND EXISTS (SELECT 1 FROM {{schema}}outbox_lanes))
           AND coalesce((SELECT bool_and(due) FROM runs), TRUE) AS ok
    ), shape AS MATERIALIZED (
        -- outbox_pick's `shape`: only keys in flight can be young. Rows
        -- are counted per key before a key is looked up among the young
        -- ones: asked of each row, the window was joined to the young keys
        -- row by row (a claim setting a 1,000-row burst aside beside a
        -- full batch in flight took 21 ms, now 7.4: `outbox-bench claim
        -- --rounds 3`, `set-aside-1000`, BENCHMARKS.md).
        SELECT p_ordered AND (SELECT any_live FROM facts)
               AND coalesce((SELECT sum(g.n) FILTER (WHERE g.n >= 32
                                                       AND g.partition_key IN (SELECT key FROM young_keys))
                             FROM (SELECT s.partition_key, count(*) AS n FROM stream s
                                   WHERE s.live GROUP BY s.partition_key) g), 0)
                   >= greatest((SELECT n FROM facts)::numeric / 2, p_limit / 2, 32) AS dominated
    ), defer AS MATERIALIZED (
        SELECT CASE WHEN NOT p_ordered THEN FALSE
                    WHEN p_defer_young THEN TRUE
                    WHEN (SELECT n FROM picked) > 0 THEN (SELECT dominated FROM shape)
                    ELSE EXISTS (
                        SELECT 1 FROM (SELECT o.keys FROM {{schema}}outbox_order o
                                       ORDER BY o.first_position DESC LIMIT 4) o
                        CROSS JOIN LATERAL unnest(o.keys) AS k(key)
                        WHERE k.key NOT IN (SELECT key FROM live_keys)) END AS young
    ), left_out AS MATERIALIZED (
        -- The window's rows before the cut not picked: the in-flight keys'
        -- (per-key claims only), and those of keys with a burst set aside
        -- when the others filled the batch. With neither, every row before
        -- the cut was picked: asked once, not of each row (a drain's claim).
        SELECT s.sequence, s.position, s.partition_key,
               NOT (SELECT young FROM defer)
               AND s.partition_key IN (SELECT key FROM young_keys) AS holds
        FROM stream s
        WHERE ((SELECT any_live FROM facts) OR EXISTS (SELECT 1 FROM lane_keys))
          AND s.sequence NOT IN (SELECT sequence FROM picks)
          AND s.position < coalesce((SELECT cut FROM picked), p_to)
    ), laned AS (
        INSERT INTO {{schema}}outbox_lanes (partition_key, first_position, sequences, positions, size)
        SELECT d.partition_key, min(d.position), array_agg(d.sequence ORDER BY d.position),
               array_agg(d.position ORDER BY d.position), count(*)
        FROM left_out d WHERE NOT d.holds AND (SELECT ok FROM applies)
        GROUP BY d.partition_key, d.position / 1024
    ), lane_taken AS (
        SELECT p.partition_key, p.lane, max(p.lane_index) AS upto
        FROM picks p WHERE p.lane IS NOT NULL AND (SELECT ok FROM applies)
        GROUP BY p.partition_key, p.lane
    )
    SELECT p.sequences, p.positions,
           CASE WHEN p.n > 0 THEN array_fill(TRUE, ARRAY[p.n::integer]) END,
           p.keys, NULL::bigint,
           CASE WHEN (SELECT ok FROM applies) THEN
               least((SELECT min(position) FROM left_out WHERE holds),
                     CASE WHEN p.cut IS NOT NULL THEN
                         (SELECT min(s.position) FROM stream s
                          WHERE s.position > p.cut
                            AND s.sequence NOT IN (SELECT sequence FROM picks)) END,
                     p_to) END,
           (SELECT array_agg(position) FROM left_out WHERE NOT holds),
           (SELECT young FROM defer),
           (SELECT dominated FROM shape),
           (SELECT array_agg(partition_key ORDER BY partition_key, lane) FROM lane_taken),
           (SELECT array_agg(lane ORDER BY partition_key, lane) FROM lane_taken),
           (SELECT array_agg(upto ORDER BY partition_key, lane) FROM lane_taken)
    FROM picked p
    INTO sequences, positions, from_stream, keys, suspect, stop, deferred_positions, deferring,
         dominated, v_lane_keys, v_lanes, v_taken;
    -- Asked here, not in the function: most picks take no lane row, and
    -- a call is a statement of its own.
    IF v_lanes IS NOT NULL THEN
        PERFORM {{schema}}outbox_lanes_take(v_lane_keys, v_lanes, v_taken);
    END IF;
END
$$;

