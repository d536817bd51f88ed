-- The runs of claim order that hold positions [p_from, p_to): from the
-- one holding p_from (a run may start before it) to the last starting
-- before p_to. Every pick reads its window through this. A single
-- STABLE SELECT, so the planner inlines it into each caller's statement.
CREATE OR REPLACE FUNCTION {{schema}}outbox_window_runs(p_from bigint, p_to bigint)
    RETURNS TABLE (first_position bigint, sequences bigint[], keys text[],
                   available_at timestamptz[])
    LANGUAGE sql STABLE AS $$
    SELECT o.first_position, o.sequences, o.keys, o.available_at
    FROM {{schema}}outbox_order o
    WHERE o.first_position >= (SELECT coalesce(max(x.first_position), 0)
                               FROM {{schema}}outbox_order x WHERE x.first_position <= p_from)
      AND o.first_position < p_to
$$;

-- A key's first `p_limit` lane rows not yet taken, in claim order, with
-- the entry each comes from and its index there: only the entries a batch
-- can take from are read (by their sizes), each sliced to it. Both picks
-- take a key's lanes through this; inlined as outbox_window_runs is.
CREATE OR REPLACE FUNCTION {{schema}}outbox_lane_head(p_key text, p_limit integer)
    RETURNS TABLE (sequence bigint, claim_position bigint, lane bigint, lane_index integer)
    LANGUAGE sql STABLE AS $$
    SELECT u.sequence, u.position, l.first_position, l.taken + u.i::integer
    FROM (SELECT z.* FROM (
              SELECT z.*, sum(z.size - z.taken) OVER (ORDER BY z.first_position) AS upto
              FROM (SELECT * FROM {{schema}}outbox_lanes z
                    WHERE z.partition_key = p_key
                    ORDER BY z.first_position LIMIT p_limit) z) z
          WHERE z.upto - (z.size - z.taken) < p_limit) l
    CROSS JOIN LATERAL unnest(l.sequences[l.taken + 1 : l.taken + p_limit],
                              l.positions[l.taken + 1 : l.taken + p_limit])
        WITH ORDINALITY AS u(sequence, position, i)
$$;

-- Lane rows a pick took: entry (p_keys[i], p_lanes[i]) is taken up to
-- index p_taken[i], and deleted once taken whole. Both picks call it after
-- their statement, when they took lane rows (nothing else writes lanes:
-- claims, under the claim lock).
CREATE OR REPLACE FUNCTION {{schema}}outbox_lanes_take(
    p_keys text[], p_lanes bigint[], p_taken integer[]) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    WITH took AS (
        SELECT * FROM unnest(p_keys, p_lanes, p_taken) AS t(partition_key, lane, upto)
    ), advanced AS (
        UPDATE {{schema}}outbox_lanes l SET taken = t.upto
        FROM took t
        WHERE l.partition_key = t.partition_key AND l.first_position = t.lane
          AND t.upto < l.size
    )
    DELETE FROM {{schema}}outbox_lanes l
    USING took t
    WHERE l.partition_key = t.partition_key AND l.first_position = t.lane
      AND t.upto >= l.size;
END
$$;

-- Picks the next claim from the tracked rows, the lanes and the stream
-- window [p_from, p_to): a prefix of each key in claim order (per-key
-- mode), at most one crash suspect, at most p_limit rows. Stream rows
-- before the cut that cannot go now leave the stream: into their key's
-- lane when due (no row write), as tracked rows when not due yet (status
-- 4) or parked behind a blocking row (status 5); except those of a key
-- whose batch in flight is younger than a second: the cursor stops at the
-- first of those (the key's relay takes its next prefix from the stream),
-- unless `p_defer_young`, or the window gave nothing and other keys'
-- events wait at the end of the stream (`deferring`: see outbox_claim).
-- Lane rows picked are taken out of their lanes. Returns the picks in
-- claim order and where the cursor may move.
-- Functions whose result type or arguments change between versions are
-- dropped first: CREATE OR REPLACE cannot change them (nothing depends on
-- them).
DROP FUNCTION IF EXISTS {{schema}}outbox_pick(timestamptz, bigint, bigint, integer, boolean);
DROP FUNCTION IF EXISTS {{schema}}outbox_pick(timestamptz, bigint, bigint, integer, boolean, boolean);
CREATE OR REPLACE FUNCTION {{schema}}outbox_pick(
    p_now timestamptz, p_from bigint, p_to bigint, p_limit integer, p_ordered boolean,
    p_defer_young boolean,
    OUT sequences bigint[], OUT positions bigint[], OUT from_stream boolean[],
    OUT keys text[], OUT suspect bigint, OUT stop bigint, OUT deferred_positions bigint[],
    OUT deferring boolean, OUT dominated boolean)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_lane_keys text[];
    v_lanes     bigint[];
    v_taken     integer[];
BEGIN
    WITH due_keys AS MATERIALIZED (
        -- Keys with a tracked row due now (outbox_events_due): only these
        -- can give tracked rows to this claim.
        SELECT DISTINCT e.partition_key AS key FROM {{schema}}outbox_events e
        WHERE p_ordered AND e.status = 4 AND e.available_at <= p_now
    ), live_leases AS MATERIALIZED (
        SELECT l.held, l.keys, l.claimed_at FROM {{schema}}outbox_leases l
        WHERE l.token >= {{schema}}outbox_live_from() AND cardinality(l.held) > 0
    ), live_rows AS (
        SELECT unnest(held) AS sequence FROM live_leases
    ), live_keys AS (
        SELECT DISTINCT unnest(keys) AS key FROM live_leases WHERE p_ordered
    ), young_keys AS (
        SELECT DISTINCT unnest(keys) AS key FROM live_leases
        WHERE p_ordered AND claimed_at > p_now - interval '1 second'
    ), lane_keys AS MATERIALIZED (
        -- Keys with lane rows that can go now (ready, and the key not in
        -- flight), read once: whether one of their entries holds a burst
        -- (64 rows or more; see picks). Entries not ready are behind a
        -- tracked row not due yet: the key is visited when it is due
        -- (due_keys), and its lanes read then.
        SELECT partition_key, bool_or(size - taken >= 64) AS burst
        FROM {{schema}}outbox_lanes
        WHERE p_ordered AND ready_at <= p_now
          AND partition_key NOT IN (SELECT key FROM live_keys)
        GROUP BY partition_key
    ), taken AS (
        SELECT unnest(positions) AS position FROM {{schema}}outbox_leases
        WHERE token >= {{schema}}outbox_kept_from() AND max_position >= p_from
    ), window_rows AS (
        -- Decided on the runs alone: every stream position a claim dealt
        -- with beyond the cursor (picked, or deferred) is in a lease's
        -- positions until the cursor passes it.
        SELECT w.position, w.sequence, w.partition_key, w.available_at <= p_now AS due
        FROM (SELECT o.first_position + u.i - 1 AS position, u.sequence, u.partition_key,
                     u.available_at
              FROM {{schema}}outbox_window_runs(p_from, p_to) o
              CROSS JOIN LATERAL unnest(o.sequences, o.keys, o.available_at) WITH ORDINALITY
                  AS u(sequence, partition_key, available_at, i)) w
        WHERE w.position >= p_from AND w.position < p_to
          AND w.position NOT IN (SELECT position FROM taken)
    ), stream AS MATERIALIZED (
        SELECT * FROM window_rows
    ), stream_keys AS MATERIALIZED (
        -- Per key in the window: its rows, and its first row not due yet.
        SELECT partition_key, count(*) AS n, min(position) FILTER (WHERE NOT due) AS late_position
        FROM stream GROUP BY partition_key
    ), waiting_keys AS (
        -- Keys with rows outside the stream that can matter to this claim:
        -- those with a tracked row due now, those with lanes, and the
        -- window's keys that wait outside the stream (of keys in flight
        -- too, to know whether a failed row blocks them), asked once per
        -- key (outbox_events_heads; parked rows are behind a blocking row,
        -- which says all the pick needs to know). A key waiting on none
        -- of these ways has nothing that can go and no row here to hold.
        SELECT key FROM due_keys
        UNION
        SELECT partition_key FROM lane_keys
        UNION
        SELECT k.partition_key FROM stream_keys k
        WHERE p_ordered
          AND EXISTS (SELECT 1 FROM {{schema}}outbox_events e
                      WHERE e.partition_key = k.partition_key AND (e.status = 4 OR e.blocks_key))
    ), late AS MATERIALIZED (
        -- Nothing of a key after its first row not due yet goes (rare:
        -- delayed events; no per-row sort otherwise).
        SELECT partition_key, late_position AS position FROM stream_keys
        WHERE late_position IS NOT NULL
    ), tracked AS (
        -- Per key waiting outside the stream, its first rows in claim
        -- order: tracked rows and lane rows (outbox_lane_head) merged.
        -- A key whose first tracked row cannot go and comes before its
        -- lanes (a retry backing off, a blocking row) has nothing in them
        -- that can: they are not read (a broker outage leaves many keys
        -- backing off with their later events in lanes).
        -- The key's rows set aside now are ready when its first tracked
        -- row is, if that row cannot go now only because it is not due.
        SELECT x.*, bool_and(x.ok) OVER (PARTITION BY x.partition_key ORDER BY x.position) AS prefix_ok,
               CASE WHEN NOT head.ok THEN head.due_at END AS ready_at
        FROM waiting_keys t
        LEFT JOIN LATERAL (
            SELECT e.position,
                   (e.status = 4 AND NOT e.blocks_key AND e.available_at <= p_now
                    AND e.sequence NOT IN (SELECT sequence FROM live_rows)) AS ok,
                   CASE WHEN e.status = 4 AND NOT e.blocks_key
                             AND e.sequence NOT IN (SELECT sequence FROM live_rows)
                        THEN e.available_at END AS due_at,
                   (SELECT min(z.first_position) FROM {{schema}}outbox_lanes z
                    WHERE z.partition_key = t.key) AS lanes_from
            FROM {{schema}}outbox_events e
            WHERE e.partition_key = t.key AND (e.status = 4 OR e.blocks_key)
            ORDER BY e.position LIMIT 1
        ) head ON TRUE
        CROSS JOIN LATERAL (
            SELECT y.* FROM (
                (SELECT e.sequence, e.partition_key, e.position, e.suspect, e.suspect_span,
                        e.blocks_key,
                        (e.status = 4 AND NOT e.blocks_key AND e.available_at <= p_now
                         AND e.sequence NOT IN (SELECT sequence FROM live_rows)) AS ok,
                        NULL::bigint AS lane, NULL::integer AS lane_index
                 FROM {{schema}}outbox_events e
                 WHERE e.partition_key = t.key AND (e.status = 4 OR e.blocks_key)
                 ORDER BY e.position LIMIT p_limit)
                UNION ALL
                SELECT h.sequence, t.key, h.claim_position, FALSE, 0, FALSE, TRUE, h.lane, h.lane_index
                FROM {{schema}}outbox_lane_head(t.key,
                         CASE WHEN NOT head.ok AND head.position < head.lanes_from THEN 0
                              ELSE p_limit END) h
                WHERE t.key NOT IN (SELECT key FROM live_keys)
            ) y
            ORDER BY y.position LIMIT p_limit
        ) x
    ), key_state AS (
        SELECT partition_key, bool_and(ok) AS all_ok, bool_or(blocks_key) AS blocked,
               max(ready_at) AS ready_at
        FROM tracked GROUP BY partition_key
    ), candidates AS (
        SELECT t.sequence, t.partition_key, t.position, t.suspect, t.suspect_span,
               t.lane IS NOT NULL AS from_stream, t.lane, t.lane_index
        FROM tracked t
        WHERE t.prefix_ok AND t.partition_key NOT IN (SELECT key FROM live_keys)
        UNION ALL
        SELECT x.sequence, x.partition_key, x.position, x.suspect, x.suspect_span, FALSE,
               NULL, NULL
        FROM (SELECT e.sequence, e.partition_key, e.position, e.suspect, e.suspect_span
              FROM {{schema}}outbox_events e
              WHERE NOT p_ordered AND e.status = 4 AND e.available_at <= p_now
                AND e.sequence NOT IN (SELECT sequence FROM live_rows)
              ORDER BY e.position LIMIT p_limit) x
        UNION ALL
        -- Unordered claims take lane rows too (lanes are written only by
        -- per-key claims; a relay switched to unordered finds them).
        SELECT x.sequence, x.partition_key, x.position, FALSE, 0, TRUE, x.lane, x.lane_index
        FROM (SELECT u.sequence, l.partition_key, u.position, l.first_position AS lane,
                     l.taken + u.i::integer AS lane_index
              FROM (SELECT * FROM {{schema}}outbox_lanes z WHERE NOT p_ordered
                    ORDER BY z.first_position LIMIT 64) l
              CROSS JOIN LATERAL unnest(l.sequences[l.taken + 1 : l.taken + p_limit],
                                        l.positions[l.taken + 1 : l.taken + p_limit])
                  WITH ORDINALITY AS u(sequence, position, i)
              ORDER BY u.position LIMIT p_limit) x
        UNION ALL
        SELECT s.sequence, s.partition_key, s.position, FALSE, 0, TRUE, NULL, NULL
        FROM stream s
        WHERE (NOT p_ordered AND s.due)
           OR (p_ordered AND s.due
               AND NOT EXISTS (SELECT 1 FROM late l
                               WHERE l.partition_key = s.partition_key AND l.position < s.position)
               AND s.partition_key NOT IN (SELECT key FROM live_keys)
               AND NOT EXISTS (SELECT 1 FROM key_state k
                               WHERE k.partition_key = s.partition_key AND NOT k.all_ok))
    ), ranked_suspects AS (
        -- Crash suspects in claim order: a lease takes the longest run of
        -- them within the smallest span among them (SuspectAllowance).
        SELECT c.partition_key, c.position,
               row_number() OVER (ORDER BY c.position) AS n,
               min(greatest(c.suspect_span, 1)) OVER (ORDER BY c.position) AS span
        FROM candidates c WHERE c.suspect
    ), left_out_suspects AS MATERIALIZED (
        -- Nothing of a key after a suspect left out.
        SELECT r.partition_key, min(r.position) AS position
        FROM ranked_suspects r
        WHERE r.position >= (SELECT min(x.position) FROM ranked_suspects x WHERE x.n > x.span)
        GROUP BY r.partition_key
    ), eligible AS (
        SELECT c.* FROM candidates c
        WHERE NOT EXISTS (SELECT 1 FROM left_out_suspects x
                          WHERE x.partition_key = c.partition_key AND x.position <= c.position)
    ), picks AS MATERIALIZED (
        -- Keys with a burst set aside (a lane entry holding 64 rows or
        -- more) fill what the other keys leave of the batch: a hot
        -- key's lane holds older positions than the events other keys
        -- commit beside it, and in claim order alone every claim made while
        -- its relay was between batches took a batch of the hot key and
        -- none of theirs (they waited for a claim made while it was in
        -- flight: others' p99 beside a 100,000-event burst 85 ms, now 37
        -- to 58). Only such keys: a drain's keys with a few rows in lanes
        -- each go in claim order (ranking every key's rows cost a sort per
        -- claim and left lanes behind, 20 % of a 100,000-key drain). A
        -- key's own rows stay in claim order.
        SELECT * FROM eligible
        ORDER BY partition_key IN (SELECT partition_key FROM lane_keys WHERE burst), position
        LIMIT p_limit
    ), cut AS (
        -- Rows after the last pick wait for the next claim if the batch is full.
        SELECT CASE WHEN count(*) >= p_limit THEN max(position) END AS position FROM picks
    ), shape AS MATERIALIZED (
        -- Whether keys with young batches in flight and runs of their own
        -- in the window (32 rows or more each) fill it: at least half of
        -- it, and half a batch. A hot key's burst, with other keys' events
        -- among or after it; not the many keys of a relay's own batch in
        -- flight, a few rows each (moving those would only cost writes).
        SELECT p_ordered
               AND coalesce(sum(g.n) FILTER (WHERE g.n >= 32
                                               AND g.partition_key IN (SELECT key FROM young_keys)), 0)
                   >= greatest(coalesce(sum(g.n), 0) / 2, p_limit / 2, 32) AS dominated
        FROM stream_keys g
    ), defer AS MATERIALIZED (
        -- Young keys' rows leave the stream too when asked; when they fill
        -- the window and other keys' events are picked beside them; or
        -- when this window gave nothing while events of keys not in flight
        -- wait at the end of the stream (committed after a hot key's
        -- burst). Otherwise the cursor waits at them: their relays take
        -- them from the stream, writing nothing.
        SELECT CASE WHEN NOT p_ordered THEN FALSE
                    WHEN p_defer_young THEN TRUE
                    WHEN EXISTS (SELECT 1 FROM picks) THEN (SELECT dominated FROM shape)
                    ELSE EXISTS (
                        SELECT 1 FROM (SELECT o.keys FROM {{schema}}outbox_order o
                                       ORDER BY o.first_position DESC LIMIT 4) o
                        CROSS JOIN LATERAL unnest(o.keys) AS k(key)
                        WHERE k.key NOT IN (SELECT key FROM live_keys)) END AS young
    ), left_out AS MATERIALIZED (
        SELECT s.sequence, s.position, s.partition_key,
               CASE WHEN NOT p_ordered THEN CASE WHEN NOT s.due THEN 4 END
                    WHEN k.blocked THEN 5
                    WHEN NOT (SELECT young FROM defer)
                         AND s.partition_key IN (SELECT key FROM young_keys) THEN NULL
                    ELSE 4 END AS new_status,
               p_ordered AND s.due AND NOT coalesce(k.blocked, FALSE) AS laned,
               k.ready_at
        FROM stream s
        LEFT JOIN key_state k ON k.partition_key = s.partition_key
        WHERE s.sequence NOT IN (SELECT sequence FROM picks)
          AND s.position < coalesce((SELECT position FROM cut), p_to)
    ), deferred AS (
        UPDATE {{schema}}outbox_events e SET status = d.new_status, position = d.position
        FROM left_out d
        WHERE e.sequence = d.sequence AND d.new_status IS NOT NULL AND NOT d.laned
          AND e.status = 0
    ), laned AS (
        -- One entry per key and 1,024 positions of the window (a claim of
        -- the key reads the entries it takes from whole: they stay small).
        INSERT INTO {{schema}}outbox_lanes (partition_key, first_position, sequences, positions, size,
                                            ready_at)
        SELECT d.partition_key, min(d.position), array_agg(d.sequence ORDER BY d.position),
               array_agg(d.position ORDER BY d.position), count(*),
               coalesce(max(d.ready_at), '-infinity')
        FROM left_out d WHERE d.new_status IS NOT NULL AND d.laned
        GROUP BY d.partition_key, d.position / 1024
    ), lane_taken AS (
        SELECT p.partition_key, p.lane, max(p.lane_index) AS upto
        FROM picks p WHERE p.lane IS NOT NULL GROUP BY p.partition_key, p.lane
    )
    SELECT (SELECT array_agg(sequence ORDER BY position) FROM picks),
           (SELECT array_agg(position ORDER BY position) FROM picks),
           (SELECT array_agg(from_stream ORDER BY position) FROM picks),
           (SELECT array_agg(DISTINCT partition_key) FROM picks),
           -- The lease's one suspect, when it holds exactly one.
           (SELECT CASE WHEN count(*) = 1 THEN min(sequence) END FROM picks WHERE picks.suspect),
           least((SELECT min(position) FROM left_out WHERE new_status IS NULL),
                 CASE WHEN (SELECT position FROM cut) IS NOT NULL THEN
                     (SELECT min(s.position) FROM stream s
                      WHERE s.position > (SELECT position FROM cut)
                        AND s.sequence NOT IN (SELECT sequence FROM picks)) END,
                 p_to),
           (SELECT array_agg(position) FROM left_out WHERE new_status IS NOT NULL),
           (SELECT young FROM defer),
           (SELECT dominated FROM shape),
           (SELECT array_agg(partition_key ORDER BY partition_key, lane) FROM lane_taken),
           (SELECT array_agg(lane ORDER BY partition_key, lane) FROM lane_taken),
           (SELECT array_agg(upto ORDER BY partition_key, lane) FROM lane_taken)
    INTO sequences, positions, from_stream, keys, suspect, stop, deferred_positions, deferring,
         dominated, v_lane_keys, v_lanes, v_taken;
    -- Asked here, not in the function: most picks take no lane row, and
    -- a call is a statement of its own.
    IF v_lanes IS NOT NULL THEN
        PERFORM {{schema}}outbox_lanes_take(v_lane_keys, v_lanes, v_taken);
    END IF;
END
$$;

