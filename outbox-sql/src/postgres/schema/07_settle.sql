-- Acks: rows that had left the stream are written published; stream rows
-- are published by their lease's positions and the cursor. Returns the
-- sequences settled (the rest were fenced off).
CREATE OR REPLACE FUNCTION {{schema}}outbox_ack(p_sequences bigint[], p_tokens bigint[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql AS $$
DECLARE
    v_rows bigint[];
    v_tracked bigint[];
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    SELECT array_agg(t.sequence), array_agg(t.sequence) FILTER (WHERE t.tracked)
    INTO v_rows, v_tracked
    FROM {{schema}}outbox_take(p_sequences, p_tokens) AS t;
    IF v_tracked IS NOT NULL THEN
        UPDATE {{schema}}outbox_events
        SET status = 2, published_at = {{schema}}outbox_now(), unfinished_claims = 0, suspect = FALSE
        WHERE sequence = ANY(v_tracked);
    END IF;
    RETURN QUERY SELECT unnest(v_rows);
END
$$;

-- Failed attempts: retry later (status 4, available after the backoff on
-- the database clock) or fail (status 3; blocking parks the key's later
-- tracked rows). History is appended. Returns the sequences settled.
CREATE OR REPLACE FUNCTION {{schema}}outbox_nack(
    p_sequences bigint[], p_tokens bigint[], p_retry_after_ms bigint[], p_block boolean[],
    p_kinds text[], p_classes text[], p_errors text[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := {{schema}}outbox_now();
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    RETURN QUERY
    WITH input AS (
        SELECT * FROM unnest(p_sequences, p_tokens, p_retry_after_ms, p_block, p_kinds, p_classes, p_errors)
            AS i(sequence, token, retry_after_ms, block, kind, class, error)
    ), taken AS (
        SELECT t.*, i.retry_after_ms, i.block, i.kind, i.class, i.error
        FROM {{schema}}outbox_take(p_sequences, p_tokens) AS t
        JOIN input i ON i.sequence = t.sequence AND i.token = t.token
    ), settled AS (
        UPDATE {{schema}}outbox_events e
        SET status = CASE WHEN t.retry_after_ms IS NULL THEN 3 ELSE 4 END,
            position = coalesce(e.position, t.claim_position),
            blocks_key = t.retry_after_ms IS NULL AND t.block,
            available_at = CASE WHEN t.retry_after_ms IS NULL THEN e.available_at
                                ELSE v_now + t.retry_after_ms * interval '1 millisecond' END,
            attempts = e.attempts + 1, unfinished_claims = 0, suspect = FALSE
        FROM taken t
        WHERE e.sequence = t.sequence
        RETURNING e.sequence, e.event_id, e.attempts, e.partition_key, e.position, e.blocks_key,
                  t.owner, t.kind, t.class, t.error
    ), history AS (
        INSERT INTO {{schema}}outbox_attempts (event_id, kind, at, actor, error_class, detail, attempts)
        SELECT event_id, kind, v_now, owner, class, error, attempts FROM settled
    ), parked AS (
        UPDATE {{schema}}outbox_events p SET status = 5
        FROM settled s
        WHERE s.blocks_key AND p.partition_key = s.partition_key AND p.status = 4
          AND p.position > s.position AND p.sequence NOT IN (SELECT sequence FROM taken)
    )
    SELECT s.sequence FROM settled s;
END
$$;

-- Leases handed back without an outcome: the rows leave the stream
-- (status 4, no attempt burned); those whose publishing had started are
-- blamed as after a crash. Returns the sequences settled.
CREATE OR REPLACE FUNCTION {{schema}}outbox_release(
    p_sequences bigint[], p_tokens bigint[], p_started boolean[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql AS $$
DECLARE
    v_lease_tokens   bigint[];
    v_lease_suspects bigint[];
    v_rows           bigint[];
    v_tokens         bigint[];
    v_positions      bigint[];
    v_started        boolean[];
    v_token          bigint;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    -- Read before the leases shrink: which row each lease suspected.
    SELECT array_agg(token), array_agg(suspect) INTO v_lease_tokens, v_lease_suspects
    FROM {{schema}}outbox_leases WHERE token = ANY(p_tokens);
    SELECT array_agg(t.sequence ORDER BY t.sequence), array_agg(t.token ORDER BY t.sequence),
           array_agg(t.claim_position ORDER BY t.sequence), array_agg(i.started ORDER BY t.sequence)
    INTO v_rows, v_tokens, v_positions, v_started
    FROM {{schema}}outbox_take(p_sequences, p_tokens) AS t
    JOIN unnest(p_sequences, p_tokens, p_started) AS i(sequence, token, started)
      ON i.sequence = t.sequence AND i.token = t.token;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    -- Stream rows leave the stream. A row already out of it (tracked, as
    -- a released head is when claimed again) keeps its one version: an
    -- unchanged rewrite is still a new version, and while a report holds
    -- xmin every one stays for later claims to step through.
    UPDATE {{schema}}outbox_events e
    SET status = 4, position = coalesce(e.position, u.position)
    FROM unnest(v_rows, v_positions, v_started) AS u(sequence, position, started)
    WHERE e.sequence = u.sequence AND NOT u.started AND e.status = 0;
    FOR v_token IN
        SELECT DISTINCT u.token FROM unnest(v_tokens, v_started) AS u(token, started) WHERE u.started
    LOOP
        PERFORM {{schema}}outbox_blame(
            ARRAY(SELECT u.sequence FROM unnest(v_rows, v_tokens, v_started) WITH ORDINALITY
                         AS u(sequence, token, started, i)
                  WHERE u.token = v_token AND u.started ORDER BY u.i),
            ARRAY(SELECT u.position FROM unnest(v_positions, v_tokens, v_started) WITH ORDINALITY
                         AS u(position, token, started, i)
                  WHERE u.token = v_token AND u.started ORDER BY u.i),
            (SELECT u.suspect FROM unnest(v_lease_tokens, v_lease_suspects) AS u(token, suspect)
             WHERE u.token = v_token));
    END LOOP;
    RETURN QUERY SELECT unnest(v_rows);
END
$$;

-- Whether a claim could find anything: rows in claim order the cursor has
-- not passed, committed rows not yet ticked, tracked rows due, lane rows
-- of a key not in flight (a hot key's lane while its relay publishes is
-- nothing to claim: idle relays that took it for work claimed in a loop),
-- leases expired with rows in flight, or a tick never taken on this
-- cluster. The idle relay's one statement per poll. Every probe runs on
-- an index and stops at its first row, whatever the statistics say (a
-- bitmap scan of the transaction-id index read every row not yet ticked
-- first: 13 ms a probe during a burst).
-- Its plan is generic: the cursor's values are parameters, and with the
-- default plan cache mode every other probe was planned anew (781 plans in
-- 1,765 probes, 0.16 ms each).
CREATE OR REPLACE FUNCTION {{schema}}outbox_anything_to_do() RETURNS boolean
    LANGUAGE plpgsql STABLE SET jit = off SET enable_seqscan = off SET enable_bitmapscan = off
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM {{schema}}outbox_cursor_now;
    -- Each probe is an index probe (ORDER BY ... LIMIT 1), whatever the
    -- planner guesses of a bound it cannot see.
    RETURN c.end_position > c.position
        OR c.tick_snapshot IS NULL
        OR c.system_identifier IS DISTINCT FROM (SELECT system_identifier FROM pg_control_system())
        OR EXISTS (SELECT 1 FROM {{schema}}outbox_events e
                   WHERE e.txid >= pg_snapshot_xmax(c.tick_snapshot) AND e.status = 0
                     AND e.position IS NULL
                   ORDER BY e.txid LIMIT 1)
        OR EXISTS (SELECT 1 FROM pg_snapshot_xip(c.tick_snapshot) AS x(id)
                   CROSS JOIN LATERAL (SELECT 1 FROM {{schema}}outbox_events e
                                       WHERE e.txid = x.id AND e.status = 0
                                         AND e.position IS NULL LIMIT 1) e)
        OR EXISTS (SELECT 1 FROM {{schema}}outbox_events
                   WHERE status = 4 AND available_at <= {{schema}}outbox_now()
                   ORDER BY position LIMIT 1)
        OR EXISTS (SELECT 1 FROM {{schema}}outbox_lanes l
                   WHERE l.partition_key NOT IN (
                       SELECT unnest(x.keys) FROM {{schema}}outbox_leases x
                       WHERE x.token >= c.live_from AND cardinality(x.held) > 0)
                   ORDER BY l.partition_key, l.first_position LIMIT 1)
        OR EXISTS (SELECT 1 FROM {{schema}}outbox_leases
                   WHERE token >= c.live_from
                     AND expires_at <= {{schema}}outbox_now() AND cardinality(held) > 0
                   ORDER BY token LIMIT 1);
END
$$;

-- Producer transactions (virtual transaction ids) that inserted events and
-- are still open, of `p_watched` (all, if NULL), then whether anything is
-- claimable, read with a later snapshot than the locks: a producer gone
-- from the locks has committed or rolled back before that snapshot, so its
-- rows are seen (locks are released after the commit is visible).
CREATE OR REPLACE FUNCTION {{schema}}outbox_watch_producers(p_watched text[])
    RETURNS TABLE (in_flight text[], anything boolean)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_in_flight text[];
BEGIN
    SELECT coalesce(array_agg(l.virtualtransaction), '{}') INTO v_in_flight
    FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = {{producer_lock_classid}} AND l.objid = {{producer_lock_objid}} AND l.objsubid = 1
      AND (p_watched IS NULL OR l.virtualtransaction = ANY(p_watched));
    RETURN QUERY SELECT v_in_flight, {{schema}}outbox_anything_to_do();
END
$$;

