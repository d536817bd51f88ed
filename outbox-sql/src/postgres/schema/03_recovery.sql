-- Rows `p_rows` (at stream positions `p_positions`) of one lease ended
-- without an outcome after publishing may have started: they leave the
-- stream as suspects, judged as outbox_core::store::judge_crash says. The
-- crash counts on one row only when it is certain which (the lease's one
-- suspect, or a single row), and that row goes alone from now on; the
-- lease's other suspects crashed again together and go back in halves;
-- the rest crashed for the first time and go back together (a dead relay's
-- batch). `p_suspect` is the lease's one suspect, if it held one. Returns
-- how many rows it wrote.
CREATE OR REPLACE FUNCTION {{schema}}outbox_blame(p_rows bigint[], p_positions bigint[], p_suspect bigint)
    RETURNS bigint
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_written   bigint;
    v_suspects  integer;
    v_newcomers integer;
    v_culprit   bigint;
BEGIN
    SELECT count(*) FILTER (WHERE e.suspect), count(*) FILTER (WHERE NOT e.suspect)
    INTO v_suspects, v_newcomers
    FROM {{schema}}outbox_events e WHERE e.sequence = ANY(p_rows) AND e.status IN (0, 4);
    v_culprit := CASE
        WHEN p_suspect IS NOT NULL AND p_suspect = ANY(p_rows) THEN p_suspect
        WHEN v_suspects = 1 THEN (SELECT e.sequence FROM {{schema}}outbox_events e
                                  WHERE e.sequence = ANY(p_rows) AND e.suspect LIMIT 1)
        WHEN cardinality(p_rows) = 1 THEN p_rows[1] END;
    WITH written AS (
        UPDATE {{schema}}outbox_events e
        SET status = 4, position = coalesce(e.position, u.position), suspect = TRUE,
            suspect_span = CASE WHEN e.sequence = v_culprit THEN 1
                                WHEN e.suspect THEN greatest((v_suspects + 1) / 2, 1)
                                ELSE greatest(v_newcomers, 1) END,
            unfinished_claims = e.unfinished_claims
                + CASE WHEN e.sequence = v_culprit THEN 1 ELSE 0 END
        FROM unnest(p_rows, p_positions) AS u(sequence, position)
        WHERE e.sequence = u.sequence AND e.status IN (0, 4)
        RETURNING 1
    )
    SELECT count(*) INTO v_written FROM written;
    RETURN v_written;
END
$$;

-- Rows of a lease whose publishing never started go back, unblamed: they
-- leave the stream (status 4, at their claim position) as on a release.
-- Rows already out of the stream are not written again (see
-- outbox_release).
CREATE OR REPLACE FUNCTION {{schema}}outbox_return(p_rows bigint[], p_positions bigint[])
    RETURNS bigint
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_written bigint;
BEGIN
    UPDATE {{schema}}outbox_events e
    SET status = 4, position = coalesce(e.position, u.position)
    FROM unnest(p_rows, p_positions) AS u(sequence, position)
    WHERE e.sequence = u.sequence AND e.status = 0;
    GET DIAGNOSTICS v_written = ROW_COUNT;
    RETURN v_written;
END
$$;

-- Leases that expired with rows still in flight: the rows leave the stream
-- (status 4, at their claim position) and the crash is blamed (README,
-- "Crash loops"): on the lease's one suspect if it held one, on the row if
-- it was the only one in flight, otherwise every row becomes a suspect and
-- is retried as the only suspect of a later lease. A relay publishes its
-- leases one at a time in claim order and claims the next meanwhile: of an
-- owner's leases in flight only the oldest can have started, so a younger
-- one goes back unblamed (and is marked so when the older one is reaped
-- first).
CREATE OR REPLACE FUNCTION {{schema}}outbox_reap(p_now timestamptz) RETURNS bigint
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_written bigint;
BEGIN
    WITH old AS (
        SELECT l.token, l.owner, l.held, l.held_positions, l.suspect,
               l.unstarted OR EXISTS (
                   SELECT 1 FROM {{schema}}outbox_leases o
                   WHERE o.token >= {{schema}}outbox_live_from()
                     AND o.owner = l.owner AND o.token < l.token AND cardinality(o.held) > 0
               ) AS unstarted
        FROM {{schema}}outbox_leases l
        WHERE l.token >= {{schema}}outbox_live_from()
          AND l.expires_at <= p_now AND cardinality(l.held) > 0
        FOR UPDATE OF l
    ), marked AS (
        UPDATE {{schema}}outbox_leases y SET unstarted = TRUE
        FROM old
        WHERE y.token >= {{schema}}outbox_live_from()
          AND y.owner = old.owner AND y.token > old.token AND y.expires_at > p_now
          AND cardinality(y.held) > 0
    ), emptied AS (
        -- By token, probed: statistics of a table with a row or two live
        -- made this a scan of every lease joined afterwards, dead versions
        -- and all, on every claim while xmin was held.
        UPDATE {{schema}}outbox_leases l
        SET held = '{}', held_positions = '{}', tracked = '{}', keys = '{}', suspect = NULL
        WHERE l.token = ANY ((SELECT array_agg(token) FROM old)::bigint[])
    ), blamed AS (
        SELECT CASE WHEN old.unstarted
                    THEN {{schema}}outbox_return(old.held, old.held_positions)
                    ELSE {{schema}}outbox_blame(old.held, old.held_positions, old.suspect) END AS n
        FROM old
    )
    SELECT coalesce(sum(n), 0)::bigint INTO v_written FROM blamed;
    RETURN v_written;
END
$$;

-- Rows blamed for `p_limit` crashes, at the head of their key and not in
-- flight, end failed (a crash loop, DESIGN.md §4); under Block the rest of
-- the key is parked behind them.
CREATE OR REPLACE FUNCTION {{schema}}outbox_fail_crash_loops(
    p_now timestamptz, p_limit integer, p_block boolean, p_actor text)
    RETURNS SETOF bigint
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH looped AS (
        UPDATE {{schema}}outbox_events c
        SET status = 3, blocks_key = p_block, suspect = FALSE
        WHERE c.status = 4 AND c.unfinished_claims > 0 AND c.unfinished_claims >= p_limit
          AND c.sequence NOT IN (SELECT unnest(held) FROM {{schema}}outbox_leases
                                 WHERE token >= {{schema}}outbox_live_from() AND cardinality(held) > 0)
          AND NOT EXISTS (
              SELECT 1 FROM {{schema}}outbox_events p
              WHERE p.partition_key = c.partition_key AND (p.status IN (4, 5) OR p.blocks_key)
                AND p.position < c.position)
        RETURNING c.sequence, c.event_id, c.partition_key, c.position, c.attempts, c.unfinished_claims
    ), history AS (
        INSERT INTO {{schema}}outbox_attempts (event_id, kind, at, actor, error_class, detail, attempts)
        SELECT event_id, 'CrashLoop', p_now, p_actor, NULL,
               unfinished_claims || ' publish attempts started and none finished', attempts
        FROM looped
    ), parked AS (
        UPDATE {{schema}}outbox_events e SET status = 5
        FROM looped l
        WHERE p_block AND e.partition_key = l.partition_key AND e.status = 4 AND e.position > l.position
    )
    SELECT looped.sequence FROM looped;
END
$$;

