-- A claim: one relay at a time per table (the advisory lock; producers
-- never take it), on the database clock. Reaps expired leases, fails crash
-- loops, ticks, then picks from the cursor window by window until it has
-- something or the stream ends; leases the picks under a new token and
-- moves the cursor. Crash-looped rows come first, flagged `crash_looped`.
DROP FUNCTION IF EXISTS {{schema}}outbox_claim(text, integer, interval, integer, boolean, boolean);
CREATE OR REPLACE FUNCTION {{schema}}outbox_claim(
    p_owner text, p_limit integer, p_lease interval, p_crash_loop_limit integer,
    p_ordered boolean, p_block boolean)
    RETURNS TABLE (crash_looped boolean, sequence bigint, event_id uuid, aggregate_type text,
                   aggregate_id text, event_type text, partition_key text, payload text,
                   payload_version integer, headers text, created_at timestamptz,
                   available_at timestamptz, attempts integer, fencing_token bigint,
                   lease_expires_at timestamptz)
    -- Generic plans are made once per connection, often while the tables
    -- are nearly empty: every statement of a claim is meant to run on
    -- indexes, so the planner is told so rather than left to guess.
    LANGUAGE plpgsql SET jit = off SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz;
    v_state    record;
    v_live_from bigint;
    v_kept_from bigint;
    v_cursor   bigint;
    v_end      bigint;
    v_from     bigint;
    v_stop     bigint;
    v_pick     record;
    v_token    bigint;
    v_expires  timestamptz;
    -- A window a quarter larger than the batch: rows held by a batch in
    -- flight are skipped without making the claim come back short. Larger
    -- while busy keys fill the windows (outbox_pass_window).
    v_window   bigint := greatest(p_limit + p_limit / 4, 64);
    v_hint     bigint;
    v_next     bigint;
    v_round    integer;
    v_rounds   integer := 4;
    v_to       bigint;
    v_taken    bigint[];
    v_defer    boolean := FALSE;
    v_plain    boolean := TRUE;
    v_plain_pick boolean;
    v_first    bigint;
BEGIN
    PERFORM pg_advisory_xact_lock({{claim_lock}});
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Planned once per connection: custom plans of these statements cost
    -- more to make than to run.
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    v_now := {{schema}}outbox_now();
    IF pg_sequence_last_value('{{schema}}outbox_relay_waiting') = 1 THEN
        PERFORM setval('{{schema}}outbox_relay_waiting', 0);
    END IF;
    PERFORM {{schema}}outbox_reap(v_now);
    -- Rows are read by primary key, one lateral probe each, whatever the
    -- planner guesses of an array's length or the table's size (a LIMIT
    -- keeps the probe from being turned into a join that scans the index).
    RETURN QUERY
        SELECT TRUE, e.sequence, e.event_id, e.aggregate_type, e.aggregate_id, e.event_type,
               e.partition_key, e.payload::text, e.payload_version, e.headers::text, e.created_at,
               e.available_at, e.attempts, NULL::bigint, NULL::timestamptz
        FROM {{schema}}outbox_fail_crash_loops(v_now, p_crash_loop_limit, p_block, p_owner) AS f(s)
        CROSS JOIN LATERAL (SELECT * FROM {{schema}}outbox_events x WHERE x.sequence = f.s LIMIT 1) e;
    PERFORM {{schema}}outbox_tick();
    v_now := {{schema}}outbox_clock();
    SELECT * INTO v_state FROM {{schema}}outbox_cursor_now;
    v_cursor := v_state.position;
    v_end := v_state.end_position;
    -- Leases below the live watermark hold no row: those whose positions
    -- the cursor has passed are deleted. Then both watermarks move up to
    -- the first lease still live (or the next one) and the first left.
    -- By token only: every lease ever deleted is below the cursor, so the
    -- index by max_position holds their dead entries there while a
    -- transaction anywhere keeps xmin back (25,000 stepped over per claim
    -- after four minutes; the planner chose it once statistics said the
    -- table holds a row or two). `+ 0` keeps that index out of the plan.
    DELETE FROM {{schema}}outbox_leases
    WHERE token >= v_state.kept_from AND token < v_state.live_from
      AND max_position + 0 < v_cursor;
    v_live_from := coalesce(
        (SELECT min(token) FROM {{schema}}outbox_leases
         WHERE token >= v_state.live_from AND cardinality(held) > 0),
        -- From the watermark, as every read of the leases: with no lease
        -- live, the newest ones are dead versions a held xmin keeps.
        (SELECT max(token) + 1 FROM {{schema}}outbox_leases WHERE token >= v_state.live_from),
        v_state.live_from);
    v_kept_from := least(v_live_from, coalesce(
        (SELECT min(token) FROM {{schema}}outbox_leases WHERE token >= v_state.kept_from),
        v_live_from));
    -- A window holds `v_window` positions no claim has dealt with yet (the
    -- ones claims took beyond the cursor are skipped, not counted). Windows
    -- after the first are read only while every earlier one was dealt with
    -- entirely and gave nothing (a claim never scans the whole backlog: at
    -- most four windows).
    --
    -- A window that gives nothing because every row in it belongs to keys
    -- whose young batches are in flight (one hot key's burst) holds the
    -- cursor; if events of keys not in flight wait at the end of the stream
    -- (committed after the burst), the claim sets the busy keys' rows aside
    -- instead (into their lanes, one entry per key and window: their
    -- relays go on from there) and reads on through windows four times
    -- larger each round, up to sixteen, so other keys wait for one claim,
    -- not for the burst's drain. One key alone (nothing else waiting) is
    -- never set aside: its relay reads its next prefix from the stream.
    v_hint := (SELECT last_value FROM {{schema}}outbox_pass_window);
    v_window := greatest(v_window, v_hint);
    v_from := v_cursor;
    v_stop := v_cursor;
    v_round := 0;
    LOOP
        v_round := v_round + 1;
        v_to := least(v_end, v_from + v_window
            + (SELECT count(*) FROM {{schema}}outbox_leases l CROSS JOIN LATERAL unnest(l.positions) AS p
               WHERE l.token >= v_kept_from AND l.max_position >= v_from AND p >= v_from));
        v_plain_pick := FALSE;
        IF v_plain THEN
            SELECT * INTO v_pick
            FROM {{schema}}outbox_pick_plain(v_now, v_from, v_to, p_limit, p_ordered, v_defer);
            v_plain_pick := v_pick.stop IS NOT NULL;
            -- Not the plain case: the general pick for the rest of this claim.
            v_plain := v_plain_pick;
        END IF;
        IF NOT v_plain_pick THEN
            SELECT * INTO v_pick
            FROM {{schema}}outbox_pick(v_now, v_from, v_to, p_limit, p_ordered, v_defer);
        END IF;
        IF v_pick.deferring AND NOT v_defer THEN
            v_defer := TRUE;
            v_rounds := 16;
        END IF;
        IF v_stop = v_from THEN
            v_stop := v_pick.stop;
        END IF;
        EXIT WHEN v_pick.sequences IS NOT NULL OR v_to >= v_end OR v_pick.stop < v_to
               OR v_round >= v_rounds;
        v_from := v_to;
        IF v_defer THEN
            v_window := least(v_window * 4, 16384);
        END IF;
    END LOOP;
    -- The next claim's window: four times larger while busy keys fill the
    -- windows and this one did not fill the batch; halved back when a
    -- window neither filled a batch nor was full of busy keys.
    v_next := CASE WHEN coalesce(cardinality(v_pick.sequences), 0) >= p_limit THEN v_hint
                   WHEN v_pick.dominated AND v_pick.deferring THEN least(v_window * 4, 16384)
                   ELSE greatest(v_hint / 2, 1) END;
    IF v_next <> v_hint THEN
        PERFORM setval('{{schema}}outbox_pass_window', v_next);
    END IF;
    IF v_stop > v_cursor OR v_live_from <> v_state.live_from OR v_kept_from <> v_state.kept_from THEN
        PERFORM {{schema}}outbox_cursor_write(greatest(v_stop, v_cursor), v_state.end_position,
            v_state.tick_snapshot, v_state.system_identifier,
            CASE WHEN v_stop > v_cursor THEN v_now ELSE v_state.moved_at END,
            v_state.rebased_at, v_live_from, v_kept_from);
    END IF;
    IF v_stop > v_cursor THEN
        IF coalesce((SELECT g.at FROM {{schema}}outbox_cursor_log g ORDER BY g.position DESC LIMIT 1),
                    '-infinity') <= v_now - interval '1 second' THEN
            INSERT INTO {{schema}}outbox_cursor_log (position, at) VALUES (v_stop, v_now)
            ON CONFLICT DO NOTHING;
        END IF;
    END IF;
    -- The lease keeps the stream positions this claim took or set aside
    -- beyond the cursor (they are dealt with; the next claim skips them);
    -- those the cursor passed need no record.
    v_taken := coalesce((SELECT array_agg(p) FROM unnest(v_pick.positions, v_pick.from_stream) AS u(p, f)
                         WHERE f AND p >= greatest(v_stop, v_cursor)), '{}')
               || coalesce((SELECT array_agg(p) FROM unnest(v_pick.deferred_positions) AS p
                            WHERE p >= greatest(v_stop, v_cursor)), '{}');
    IF v_pick.sequences IS NULL AND cardinality(v_taken) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO {{schema}}outbox_leases (owner, claimed_at, expires_at, held, held_positions, tracked,
                                         positions, max_position, keys, suspect)
    VALUES (p_owner, v_now, v_now + p_lease, coalesce(v_pick.sequences, '{}'),
            coalesce(v_pick.positions, '{}'),
            coalesce((SELECT array_agg(s) FROM unnest(v_pick.sequences, v_pick.from_stream) AS u(s, f)
                      WHERE NOT f), '{}'),
            v_taken, coalesce((SELECT max(p) FROM unnest(v_taken) AS p), -1),
            CASE WHEN p_ordered THEN coalesce(v_pick.keys, '{}') ELSE '{}' END, v_pick.suspect)
    RETURNING token, expires_at INTO v_token, v_expires;
    IF v_pick.sequences IS NULL THEN
        RETURN;
    END IF;
    -- A batch of consecutive sequences in claim order (a drain's usual
    -- batch: commit order is sequence order within a tick) is one range
    -- of the primary key: read as one index scan, not a probe per row
    -- (1,000 rows: about 1.7 ms against 4.5).
    v_first := v_pick.sequences[1];
    IF v_pick.sequences[cardinality(v_pick.sequences)] - v_first + 1 = cardinality(v_pick.sequences)
       AND (SELECT bool_and(u.s = v_first + u.i - 1)
            FROM unnest(v_pick.sequences) WITH ORDINALITY AS u(s, i)) THEN
        RETURN QUERY
            SELECT FALSE, e.sequence, e.event_id, e.aggregate_type, e.aggregate_id, e.event_type,
                   e.partition_key, e.payload::text, e.payload_version, e.headers::text, e.created_at,
                   e.available_at, e.attempts, v_token, v_expires
            FROM {{schema}}outbox_events e
            WHERE e.sequence BETWEEN v_first AND v_first + cardinality(v_pick.sequences) - 1
            ORDER BY e.sequence;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT FALSE, e.sequence, e.event_id, e.aggregate_type, e.aggregate_id, e.event_type,
               e.partition_key, e.payload::text, e.payload_version, e.headers::text, e.created_at,
               e.available_at, e.attempts, v_token, v_expires
        FROM unnest(v_pick.sequences) WITH ORDINALITY AS u(s, i)
        CROSS JOIN LATERAL (SELECT * FROM {{schema}}outbox_events x WHERE x.sequence = u.s LIMIT 1) e
        ORDER BY u.i;
END
$$;

-- Rows a settlement takes out of their leases: each (sequence, token) the
-- lease `token` still holds, with its position; the leases are locked (a
-- claim that would reap them waits, or already has: fenced) and keep the
-- rest. A stream row acked needs no write of its own: its lease keeps its
-- position until the cursor has passed it.
DROP FUNCTION IF EXISTS {{schema}}outbox_take(bigint[], bigint[]);
CREATE OR REPLACE FUNCTION {{schema}}outbox_take(p_sequences bigint[], p_tokens bigint[])
    RETURNS TABLE (sequence bigint, token bigint, claim_position bigint, tracked boolean, owner text)
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_lease record;
BEGIN
    -- The common settlement: every row of one lease at once (a relay's
    -- whole batch published). The lease empties: no set operations over
    -- the batch (3.4 ms a batch of 1,000 in the general statement below,
    -- the PgQ profile of BENCHMARKS.md).
    IF cardinality(p_tokens) > 0 AND p_tokens[1] = ALL (p_tokens) THEN
        SELECT l.token, l.owner, l.held, l.held_positions, l.tracked INTO v_lease
        FROM {{schema}}outbox_leases l WHERE l.token = p_tokens[1]
        FOR UPDATE;
        IF FOUND AND cardinality(v_lease.held) = cardinality(p_sequences)
           AND (v_lease.held = p_sequences
                OR ARRAY(SELECT x FROM unnest(v_lease.held) AS x ORDER BY x)
                   = ARRAY(SELECT x FROM unnest(p_sequences) AS x ORDER BY x)) THEN
            UPDATE {{schema}}outbox_leases l
            SET held = '{}', held_positions = '{}', tracked = '{}', keys = '{}', suspect = NULL
            WHERE l.token = v_lease.token;
            RETURN QUERY
            SELECT u.s, v_lease.token, u.p,
                   cardinality(v_lease.tracked) > 0 AND u.s = ANY (v_lease.tracked),
                   v_lease.owner
            FROM unnest(v_lease.held, v_lease.held_positions) AS u(s, p);
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    WITH input AS (
        SELECT DISTINCT i.sequence, i.token FROM unnest(p_sequences, p_tokens) AS i(sequence, token)
    ), locked AS (
        SELECT l.token, l.owner, l.held, l.held_positions, l.tracked, l.suspect
        FROM {{schema}}outbox_leases l
        WHERE l.token = ANY (p_tokens)
        FOR UPDATE
    ), held_rows AS MATERIALIZED (
        SELECT lk.token, lk.owner, u.s AS sequence, u.p AS position
        FROM locked lk CROSS JOIN LATERAL unnest(lk.held, lk.held_positions) AS u(s, p)
    ), tracked_rows AS MATERIALIZED (
        SELECT lk.token, unnest(lk.tracked) AS sequence FROM locked lk
    ), valid AS (
        SELECT h.sequence, h.token, h.position, h.owner, t.sequence IS NOT NULL AS tracked
        FROM held_rows h
        JOIN input i ON i.token = h.token AND i.sequence = h.sequence
        LEFT JOIN tracked_rows t ON t.token = h.token AND t.sequence = h.sequence
    ), rest AS (
        SELECT lk.token,
               coalesce(array_agg(u.s ORDER BY u.i) FILTER (WHERE v.sequence IS NULL), '{}') AS held,
               coalesce(array_agg(u.p ORDER BY u.i) FILTER (WHERE v.sequence IS NULL), '{}') AS held_positions
        FROM locked lk
        CROSS JOIN LATERAL unnest(lk.held, lk.held_positions) WITH ORDINALITY AS u(s, p, i)
        LEFT JOIN valid v ON v.token = lk.token AND v.sequence = u.s
        GROUP BY lk.token
    ), shrunk AS (
        UPDATE {{schema}}outbox_leases l
        SET held = r.held, held_positions = r.held_positions,
            tracked = ARRAY(SELECT t FROM unnest(l.tracked) AS t WHERE t = ANY(r.held)),
            keys = CASE WHEN cardinality(r.held) = 0 THEN '{}' ELSE l.keys END,
            suspect = CASE WHEN l.suspect = ANY(r.held) THEN l.suspect END
        FROM rest r
        -- Leases probed by token (see outbox_reap's `emptied`).
        WHERE l.token = ANY (p_tokens) AND l.token = r.token
          AND cardinality(r.held) < cardinality(l.held)
    )
    SELECT v.sequence, v.token, v.position, v.tracked, v.owner FROM valid v;
END
$$;

