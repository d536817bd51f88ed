-- Enqueue from any language, with the same checks, ordering and delay
-- semantics as the Rust `enqueue` (README, "Enqueue from SQL"). Returns the
-- new row's sequence, or NULL when an event with this id exists (a no-op).
-- `p_partition_key` NULL (or left out) is the aggregate id, as a Rust
-- event built without `.partition_key(..)`: SQL cannot tell an explicit
-- NULL from a missing argument.
CREATE OR REPLACE FUNCTION {{schema}}outbox_enqueue(
    p_event_id        uuid,
    p_event_type      text,
    p_aggregate_type  text,
    p_aggregate_id    text,
    p_payload         jsonb,
    p_partition_key   text DEFAULT NULL,
    p_headers         jsonb DEFAULT '{}',
    p_payload_version integer DEFAULT 1,
    p_delay           interval DEFAULT NULL
) RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    v_key      text := coalesce(p_partition_key, p_aggregate_id);
    v_field    text;
    v_value    text;
    v_sequence bigint;
BEGIN
    IF p_event_id IS NULL THEN
        RAISE EXCEPTION 'outbox: event_id must not be null' USING ERRCODE = '22023';
    END IF;
    FOREACH v_field IN ARRAY ARRAY['event_type', 'aggregate_type', 'aggregate_id', 'partition_key'] LOOP
        v_value := CASE v_field WHEN 'event_type' THEN p_event_type
                                WHEN 'aggregate_type' THEN p_aggregate_type
                                WHEN 'aggregate_id' THEN p_aggregate_id
                                ELSE v_key END;
        IF v_value IS NULL OR btrim(v_value) = '' THEN
            RAISE EXCEPTION 'outbox: event field `%` must not be empty', v_field USING ERRCODE = '22023';
        END IF;
        IF octet_length(v_value) > {{max_identifier_bytes}} THEN
            RAISE EXCEPTION 'outbox: event field `%` is % bytes, longer than the limit of {{max_identifier_bytes}}',
                v_field, octet_length(v_value) USING ERRCODE = '22023';
        END IF;
    END LOOP;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'outbox: payload must not be null (use the JSON value null)' USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_payload::text) > {{max_payload_bytes}} THEN
        RAISE EXCEPTION 'outbox: payload is % bytes, larger than the limit of {{max_payload_bytes}}',
            octet_length(p_payload::text) USING ERRCODE = '22023';
    END IF;
    IF p_headers IS NULL OR jsonb_typeof(p_headers) <> 'object' THEN
        RAISE EXCEPTION 'outbox: headers must be a JSON object of string values' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_each(p_headers) WHERE jsonb_typeof(value) <> 'string') THEN
        RAISE EXCEPTION 'outbox: every header value must be a JSON string' USING ERRCODE = '22023';
    END IF;
    -- The envelope's names (outbox_core::event::wire::is_reserved).
    SELECT k INTO v_field FROM jsonb_object_keys(p_headers) AS k
    WHERE k IN ('event_id', 'event_type', 'partition_key', 'aggregate_type', 'aggregate_id',
                'payload_version', 'occurred_at', 'payload', 'outbox_headers')
    LIMIT 1;
    IF v_field IS NOT NULL THEN
        RAISE EXCEPTION 'outbox: header `%` is reserved for the event''s envelope on every broker; rename it',
            v_field USING ERRCODE = '22023';
    END IF;
    IF (SELECT coalesce(sum(octet_length(key) + octet_length(value #>> '{}')), 0)
        FROM jsonb_each(p_headers)) > {{max_header_bytes}} THEN
        RAISE EXCEPTION 'outbox: headers are larger than the limit of {{max_header_bytes}} bytes'
            USING ERRCODE = '22023';
    END IF;
    IF p_payload_version IS NULL OR p_payload_version < 0 THEN
        RAISE EXCEPTION 'outbox: payload_version must be a non-negative integer' USING ERRCODE = '22023';
    END IF;
    IF p_delay < interval '0' THEN
        RAISE EXCEPTION 'outbox: delay must not be negative' USING ERRCODE = '22023';
    END IF;
    INSERT INTO {{schema}}outbox_events (event_id, aggregate_type, aggregate_id, event_type,
        partition_key, payload, payload_version, headers, available_at)
    VALUES (p_event_id, p_aggregate_type, p_aggregate_id, p_event_type, v_key, p_payload,
        p_payload_version, p_headers, {{schema}}outbox_now() + coalesce(p_delay, interval '0'))
    ON CONFLICT (event_id) DO NOTHING
    RETURNING sequence INTO v_sequence;
    RETURN v_sequence;
END
$$;

-- Appends to claim order every stream row whose transaction committed
-- since the last tick (PgQ's batch rule: visible in this snapshot, not in
-- the last one; only the last snapshot's in-progress xids and the xids at
-- or above its xmax need looking at). A transaction that commits late is
-- appended when it commits; one left open elsewhere on the server delays
-- nothing but its own rows. Runs under the claim lock.
CREATE OR REPLACE FUNCTION {{schema}}outbox_tick() RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    v_snapshot pg_snapshot := pg_current_snapshot();
    v_system   bigint := (SELECT system_identifier FROM pg_control_system());
    v_cursor   record;
    v_count    bigint;
BEGIN
    SELECT * INTO v_cursor FROM {{schema}}outbox_cursor_now;
    IF NOT FOUND THEN
        -- The first claim on these tables (see outbox_control).
        INSERT INTO {{schema}}outbox_control (id) VALUES (TRUE) ON CONFLICT (id) DO NOTHING;
        -- Tables of an earlier release kept the cursor in one row of
        -- outbox_cursor: go on from it.
        IF to_regclass('{{schema}}outbox_cursor') IS NOT NULL THEN
            INSERT INTO {{schema}}outbox_cursor_states
                (position, end_position, tick_snapshot, system_identifier, moved_at, rebased_at)
            SELECT position, end_position, tick_snapshot, system_identifier, moved_at, rebased_at
            FROM {{schema}}outbox_cursor;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM {{schema}}outbox_cursor_states) THEN
            INSERT INTO {{schema}}outbox_cursor_states DEFAULT VALUES;
        END IF;
        SELECT * INTO v_cursor FROM {{schema}}outbox_cursor_now;
    END IF;
    IF v_cursor.tick_snapshot IS NULL
       OR v_cursor.system_identifier IS DISTINCT FROM v_system
       OR pg_snapshot_xmax(v_snapshot) < pg_snapshot_xmax(v_cursor.tick_snapshot) THEN
        RETURN {{schema}}outbox_rebase(v_snapshot, v_system);
    END IF;
    WITH new_rows AS (
        SELECT e.sequence, e.partition_key, e.available_at FROM {{schema}}outbox_events e
        WHERE e.txid >= pg_snapshot_xmax(v_cursor.tick_snapshot)
          AND e.txid < pg_snapshot_xmax(v_snapshot)
          AND e.status = 0 AND e.position IS NULL
          AND pg_visible_in_snapshot(e.txid, v_snapshot)
        UNION ALL
        -- One index probe per transaction the last tick saw in progress
        -- and this one sees committed (one still running has nothing to
        -- show yet), whatever the (generic) plan guesses of their number.
        SELECT e.sequence, e.partition_key, e.available_at
        FROM (SELECT x.id FROM pg_snapshot_xip(v_cursor.tick_snapshot) AS x(id)
              WHERE pg_visible_in_snapshot(x.id, v_snapshot) OFFSET 0) x
        CROSS JOIN LATERAL (SELECT * FROM {{schema}}outbox_events y WHERE y.txid = x.id OFFSET 0) e
        WHERE e.status = 0 AND e.position IS NULL
    ), numbered AS (
        SELECT *, row_number() OVER (ORDER BY sequence) - 1 AS n FROM new_rows
    ), appended AS (
        INSERT INTO {{schema}}outbox_order (first_position, lo_sequence, hi_sequence, ticked_at,
                                            sequences, keys, available_at)
        SELECT v_cursor.end_position + min(n), min(sequence), max(sequence), {{schema}}outbox_now(),
               array_agg(sequence ORDER BY sequence), array_agg(partition_key ORDER BY sequence),
               array_agg(available_at ORDER BY sequence)
        FROM numbered GROUP BY n / 64
        RETURNING cardinality(sequences) AS appended
    )
    SELECT coalesce(sum(appended), 0) INTO v_count FROM appended;
    -- A tick that ordered nothing keeps the last snapshot: the next one
    -- finds the same rows from it (none committed in between), and nothing
    -- is written.
    IF v_count > 0 THEN
        PERFORM {{schema}}outbox_cursor_write(v_cursor.position, v_cursor.end_position + v_count,
            v_snapshot, v_cursor.system_identifier, v_cursor.moved_at, v_cursor.rebased_at,
            v_cursor.live_from, v_cursor.kept_from);
    END IF;
    RETURN v_count;
END
$$;

-- The first tick, or the first on another cluster than the last tick's (a
-- dump restored elsewhere, a logical replica after cutover, pg_upgrade):
-- the last snapshot means nothing here, so every committed stream row not
-- yet in claim order is appended (in sequence order). Rows whose
-- transaction ids a later tick would look at again (not visible in this
-- snapshot by number: another cluster's ids, or committed since it was
-- taken) are marked as already ordered (txid 0) in the same statement.
CREATE OR REPLACE FUNCTION {{schema}}outbox_rebase(p_snapshot pg_snapshot, p_system bigint)
    RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    v_cursor record;
    v_count  bigint;
BEGIN
    -- Sequences travel neither with logical replication nor with every
    -- copy: past the rows that came with the data first, so this claim's
    -- cursor state, lease and history cannot collide with theirs.
    -- Producers need migrate() for theirs before they write (README).
    PERFORM {{schema}}outbox_sequences_past_rows();
    SELECT * INTO v_cursor FROM {{schema}}outbox_cursor_now;
    WITH ordered AS (
        SELECT unnest(sequences) AS sequence FROM {{schema}}outbox_order
    ), new_rows AS (
        SELECT e.sequence, e.partition_key, e.available_at FROM {{schema}}outbox_events e
        WHERE e.status = 0 AND e.position IS NULL
          AND NOT EXISTS (SELECT 1 FROM ordered o WHERE o.sequence = e.sequence)
    ), numbered AS (
        SELECT *, row_number() OVER (ORDER BY sequence) - 1 AS n FROM new_rows
    ), appended AS (
        INSERT INTO {{schema}}outbox_order (first_position, lo_sequence, hi_sequence, ticked_at,
                                            sequences, keys, available_at)
        SELECT v_cursor.end_position + min(n), min(sequence), max(sequence), {{schema}}outbox_now(),
               array_agg(sequence ORDER BY sequence), array_agg(partition_key ORDER BY sequence),
               array_agg(available_at ORDER BY sequence)
        FROM numbered GROUP BY n / 64
        RETURNING cardinality(sequences) AS appended
    ), settled AS (
        UPDATE {{schema}}outbox_events SET txid = '0'
        WHERE txid >= pg_snapshot_xmin(p_snapshot) AND NOT pg_visible_in_snapshot(txid, p_snapshot)
    )
    SELECT coalesce(sum(appended), 0) INTO v_count FROM appended;
    PERFORM {{schema}}outbox_cursor_write(v_cursor.position, v_cursor.end_position + v_count,
        p_snapshot, p_system, v_cursor.moved_at,
        CASE WHEN v_cursor.tick_snapshot IS NULL THEN v_cursor.rebased_at
             ELSE {{schema}}outbox_now() END,
        v_cursor.live_from, v_cursor.kept_from);
    IF v_cursor.tick_snapshot IS NOT NULL THEN
        RAISE LOG 'outbox: {{schema}}outbox_events is on another cluster (system identifier %): % events appended to claim order',
            p_system, v_count;
    END IF;
    RETURN v_count;
END
$$;

-- Index for unordered claims: tracked rows in claim order.
CREATE INDEX IF NOT EXISTS outbox_events_tracked_due
    ON {{schema}}outbox_events (position) WHERE status = 4;

