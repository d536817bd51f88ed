-- outbox schema for PostgreSQL (>= 13: xid8, pg_snapshot). Rendered with the
-- configured names and limits; the file in migrations/postgres/ is this
-- template with the defaults. README.md ("How the PostgreSQL store works")
-- explains the design; the comments here say what each piece is for.

-- Which version of this schema the tables are (migrate() refuses tables of
-- another version with an error naming the upgrade notes).
CREATE TABLE IF NOT EXISTS outbox_schema_version (version INTEGER NOT NULL);
INSERT INTO outbox_schema_version (version)
    SELECT 2 WHERE NOT EXISTS (SELECT 1 FROM outbox_schema_version);

-- What migrate() last applied: a fingerprint of this rendered text (the
-- last statements below write it). A migrate() that finds its own
-- fingerprint runs none of this DDL, so it takes no lock a producer could
-- queue behind; deploys call it at every start.
CREATE TABLE IF NOT EXISTS outbox_schema_applied (fingerprint TEXT NOT NULL);

CREATE SEQUENCE IF NOT EXISTS outbox_events_seq;

-- Store time: the database clock (every lease, delay, backoff and age is
-- measured on it, so relay and producer hosts may disagree with each other),
-- shifted only by tests (`clock_shift`). `relay_waiting` is no longer
-- read or written (the flag below replaced it); it stays so that relays of
-- the previous version keep running through a rolling deploy.
CREATE TABLE IF NOT EXISTS outbox_control (
    id            BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    clock_shift   INTERVAL NOT NULL DEFAULT '0',
    relay_waiting BOOLEAN NOT NULL DEFAULT FALSE
);
-- Its one row is written by the first claim (outbox_tick), not here: a
-- logical replica's tables made by migrate() stay empty until the
-- subscription's initial copy brings the primary's row (a row made here
-- would collide with it, and the copy would retry forever).

-- Whether a relay waits for a NOTIFY: 1 while one does, 0 (or never set)
-- otherwise. A sequence, not a column: every producer's trigger reads it,
-- and a sequence's value is one function call away (pg_sequence_last_value)
-- where the column took a query (7-9 µs of each enqueue). Its writes
-- (setval) are seen at once, not at commit, and are never rolled back;
-- for a hint that is what is wanted. Everyone may read and set it: the
-- flag only decides whether a producer's commit sends a NOTIFY, which any
-- role may send anyway, and producers and relays then need no grant beyond
-- the ones they had.
CREATE SEQUENCE IF NOT EXISTS outbox_relay_waiting MINVALUE 0 MAXVALUE 1 START 0;
GRANT SELECT, UPDATE ON SEQUENCE outbox_relay_waiting TO PUBLIC;

-- The small functions reading store time and the lease watermarks are
-- PL/pgSQL, not SQL: a SQL function with a sub-select is not inlined, and
-- each call was planned anew (27 to 52 us of planning for 7 to 11 us of
-- work: twice per enqueue, several times per claim); PL/pgSQL keeps its
-- plan for the connection.
CREATE OR REPLACE FUNCTION outbox_now() RETURNS timestamptz
    LANGUAGE plpgsql STABLE AS
$$ BEGIN RETURN now() + coalesce((SELECT clock_shift FROM outbox_control), interval '0'); END $$;

-- Store time at this instant (not at the transaction's start): claims read
-- it after they took their turn and ticked, so every row the tick ordered
-- is due unless it was delayed. (With the transaction's start, rows
-- committed while a claim waited for its turn looked delayed and left the
-- stream, a row write each; the slower claims were, the more of them.)
CREATE OR REPLACE FUNCTION outbox_clock() RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE AS
$$ BEGIN RETURN clock_timestamp() + coalesce((SELECT clock_shift FROM outbox_control), interval '0'); END $$;

CREATE TABLE IF NOT EXISTS outbox_events (
    sequence          BIGINT PRIMARY KEY DEFAULT nextval('outbox_events_seq'),
    -- The writing transaction. The first tick whose snapshot sees it
    -- committed appends the row to claim order (outbox_order): commit order
    -- between transactions, insert order within one.
    txid              xid8 NOT NULL DEFAULT pg_current_xact_id(),
    -- Claim position, written only when a row leaves the stream (status 3,
    -- 4, 5); a status-0 row's position is in outbox_order.
    position          BIGINT,
    event_id          UUID NOT NULL,
    aggregate_type    TEXT NOT NULL CHECK (btrim(aggregate_type) <> ''),
    aggregate_id      TEXT NOT NULL CHECK (btrim(aggregate_id) <> ''),
    event_type        TEXT NOT NULL CHECK (btrim(event_type) <> ''),
    partition_key     TEXT NOT NULL CHECK (btrim(partition_key) <> ''),
    payload           JSONB NOT NULL,
    payload_version   INTEGER NOT NULL DEFAULT 1 CHECK (payload_version >= 0),
    -- A flat object of string values (correlation_id, causation_id,
    -- traceparent and free keys).
    headers           JSONB NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    created_at        TIMESTAMPTZ NOT NULL DEFAULT outbox_now(),
    available_at      TIMESTAMPTZ NOT NULL DEFAULT outbox_now(),
    -- 0 pending in the stream (published once a claim's lease on it is
    --   acked; see outbox_order and outbox_leases)
    -- 2 published, written (a row that had left the stream)
    -- 3 failed
    -- 4 tracked: pending outside the stream (delayed, retrying, released,
    --   requeued, a replacement, or held behind an earlier row of its key),
    --   found by its own index wherever the cursor is
    -- 5 parked behind a failed row that blocks its key
    status            SMALLINT NOT NULL DEFAULT 0 CHECK (status IN (0, 2, 3, 4, 5)),
    blocks_key        BOOLEAN NOT NULL DEFAULT FALSE,
    superseded_by     UUID,
    attempts          INTEGER NOT NULL DEFAULT 0,
    -- Crashes blamed on this row alone (crash-loop detection), and whether
    -- it shared a lease that ended without an outcome; then, until it
    -- settles, a lease carries at most `suspect_span` suspects with it
    -- (outbox_core::store::judge_crash: a dead relay's batch goes back
    -- together, suspects that crash again go back in halves).
    unfinished_claims INTEGER NOT NULL DEFAULT 0,
    suspect           BOOLEAN NOT NULL DEFAULT FALSE,
    suspect_span      INTEGER NOT NULL DEFAULT 0,
    published_at      TIMESTAMPTZ,
    CONSTRAINT outbox_events_event_id_key UNIQUE (event_id)
);

-- Tables made before suspect spans (0 reads as 1: alone).
ALTER TABLE outbox_events ADD COLUMN IF NOT EXISTS suspect_span INTEGER NOT NULL DEFAULT 0;

-- Ticks find new rows by transaction.
CREATE INDEX IF NOT EXISTS outbox_events_txid
    ON outbox_events (txid);
-- Rows outside the stream, per key in claim order: the claim visits each
-- key's first such row (a loose index scan), never the backlog behind it.
CREATE INDEX IF NOT EXISTS outbox_events_tracked
    ON outbox_events (partition_key, position) WHERE status IN (4, 5) OR blocks_key;
-- The rows that can head a key's wait, per key in claim order: tracked
-- rows and blocking rows, not the rows parked behind a blocking row (always
-- after it, and none can go before it does). The general pick walks these:
-- with the parked rows, each claim read up to a batch of them per blocked
-- key (100 keys with 300 parked each: 66 ms a claim, against 2.5).
CREATE INDEX IF NOT EXISTS outbox_events_heads
    ON outbox_events (partition_key, position) WHERE status = 4 OR blocks_key;
-- Tracked rows by the time they are due: the keys a claim visits for its
-- tracked rows are those with one due now. A key whose tracked rows are
-- all for later (delayed events, retries backing off) or behind a blocking
-- row has nothing that can go; visiting every such key cost each claim
-- about 12 µs a key (10,000 delayed events on their own keys: 120 ms).
CREATE INDEX IF NOT EXISTS outbox_events_due
    ON outbox_events (available_at, partition_key) WHERE status = 4;
-- Rows blamed for crashes: the crash-loop sweep reads only these.
CREATE INDEX IF NOT EXISTS outbox_events_unfinished
    ON outbox_events (unfinished_claims) WHERE status = 4 AND unfinished_claims > 0;
CREATE INDEX IF NOT EXISTS outbox_events_published
    ON outbox_events (published_at) WHERE status = 2;
CREATE INDEX IF NOT EXISTS outbox_events_failed
    ON outbox_events (sequence) WHERE status = 3;
-- Failed rows of one type, of one key: an operator's filtered pages find a
-- rare type or key without stepping over every other failed row.
CREATE INDEX IF NOT EXISTS outbox_events_failed_type
    ON outbox_events (event_type, sequence) WHERE status = 3;
CREATE INDEX IF NOT EXISTS outbox_events_failed_key
    ON outbox_events (partition_key, sequence) WHERE status = 3;

-- Claim order ("the stream"): each tick appends the rows whose transactions
-- it first sees committed, in sequence order, as runs of at most 64 (small
-- enough to stay in the heap page, unTOASTed). Position p is
-- sequences[p - first_position + 1]; its key and available_at ride along,
-- so a claim decides on the run alone and reads only the rows it picks.
CREATE TABLE IF NOT EXISTS outbox_order (
    first_position BIGINT PRIMARY KEY,
    lo_sequence    BIGINT NOT NULL,
    hi_sequence    BIGINT NOT NULL,
    ticked_at      TIMESTAMPTZ NOT NULL,
    sequences      BIGINT[] NOT NULL,
    keys           TEXT[] NOT NULL,
    available_at   TIMESTAMPTZ[] NOT NULL
);
-- Which run holds a sequence (event_state, purge).
CREATE INDEX IF NOT EXISTS outbox_order_sequences
    ON outbox_order USING gist (int8range(lo_sequence, hi_sequence, '[]'));

-- Lanes: rows of a key that a claim passed without picking them (the key's
-- batch was in flight, or its head waits on a backoff), set aside in claim
-- order so the cursor can go on to other keys' events. A claim writes one
-- entry per key and window, not a row per event (a hot key's burst of
-- 100,000 events was 100,000 row writes, and every other key waited for
-- them); the rows stay status 0. The key's next claims take its rows from
-- here as from its tracked rows (`taken` counts those already leased; an
-- emptied entry is deleted). Until taken, a lane row is pending to every
-- reader (outbox_stream_pending, event_state, purge); once leased it is a
-- stream row like any other: acked, it is published (the cursor passed it),
-- and a lease that ends without an outcome writes it tracked (status 4).
CREATE TABLE IF NOT EXISTS outbox_lanes (
    partition_key  TEXT NOT NULL,
    first_position BIGINT NOT NULL,
    sequences      BIGINT[] NOT NULL,
    positions      BIGINT[] NOT NULL,
    -- cardinality(sequences), read without reading the arrays.
    size           INTEGER NOT NULL,
    taken          INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (partition_key, first_position)
);
-- Store time before which nothing of the entry can go: set when its key's
-- first waiting row was a retry or a delayed event due then (its rows are
-- behind that row), else -infinity. Claims look for lanes by it: a broker
-- outage leaves many keys backing off with their later events in lanes,
-- and visiting each on every claim cost about 8 µs a key.
ALTER TABLE outbox_lanes
    ADD COLUMN IF NOT EXISTS ready_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity';
CREATE INDEX IF NOT EXISTS outbox_lanes_ready ON outbox_lanes (ready_at);
-- Sliced on every claim of the key: stored uncompressed.
ALTER TABLE outbox_lanes ALTER COLUMN sequences SET STORAGE EXTERNAL;
ALTER TABLE outbox_lanes ALTER COLUMN positions SET STORAGE EXTERNAL;
-- How many stream positions a claim reads (at least): larger while busy
-- keys' rows fill the windows (a burst being set aside), back to a batch
-- and a quarter after. A hint, kept in a sequence: setval writes no row
-- version (a transaction holding xmin keeps none) and is not undone by a
-- rollback (harmless for a hint).
CREATE SEQUENCE IF NOT EXISTS outbox_pass_window MINVALUE 1 START 1;

-- The claim cursor and the last tick, as the newest row of
-- outbox_cursor_states (outbox_cursor_now). Every stream position below
-- `position` has been dealt with by a claim (leased, parked as tracked, or
-- published); `end_position` is the next position a tick hands out.
-- `tick_snapshot` is the snapshot of the last tick that ordered rows,
-- valid on the cluster `system_identifier` names: on any other cluster (a
-- restored dump, a logical replica after cutover) the next tick rebases
-- (README, "After a restore").
--
-- Each change is a new row, never an update: a transaction held open
-- anywhere on the server keeps every dead version of a row, and one row
-- rewritten by every claim piled up versions that each later claim read
-- (a claim 10 times the pages after 1,500 claims). Readers take the newest
-- row by its key; claims delete old states in batches. Its first row is
-- written by the first claim (outbox_tick), as outbox_control's.
CREATE TABLE IF NOT EXISTS outbox_cursor_states (
    id                BIGSERIAL PRIMARY KEY,
    position          BIGINT NOT NULL DEFAULT 0,
    end_position      BIGINT NOT NULL DEFAULT 0,
    tick_snapshot     pg_snapshot,
    system_identifier BIGINT,
    moved_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    rebased_at        TIMESTAMPTZ,
    -- Lease watermarks: every lease with a smaller token holds no row
    -- (`live_from`), or is gone (`kept_from`). Leases come and go with every
    -- batch and an open transaction keeps their dead versions in every
    -- index; reads of the live ones start at the watermark, by key, and
    -- never meet those versions.
    live_from         BIGINT NOT NULL DEFAULT 0,
    kept_from         BIGINT NOT NULL DEFAULT 0
);
CREATE OR REPLACE VIEW outbox_cursor_now AS
    SELECT * FROM outbox_cursor_states ORDER BY id DESC LIMIT 1;

-- The lease watermarks (see outbox_cursor_states).
CREATE OR REPLACE FUNCTION outbox_live_from() RETURNS bigint
    LANGUAGE plpgsql STABLE AS
$$ BEGIN RETURN coalesce((SELECT live_from FROM outbox_cursor_now), 0); END $$;
CREATE OR REPLACE FUNCTION outbox_kept_from() RETURNS bigint
    LANGUAGE plpgsql STABLE AS
$$ BEGIN RETURN coalesce((SELECT kept_from FROM outbox_cursor_now), 0); END $$;

-- Writes the cursor's new state (see outbox_cursor_states).
CREATE OR REPLACE FUNCTION outbox_cursor_write(
    p_position bigint, p_end_position bigint, p_tick_snapshot pg_snapshot,
    p_system_identifier bigint, p_moved_at timestamptz, p_rebased_at timestamptz,
    p_live_from bigint, p_kept_from bigint)
    RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO outbox_cursor_states
        (position, end_position, tick_snapshot, system_identifier, moved_at, rebased_at,
         live_from, kept_from)
    VALUES (p_position, p_end_position, p_tick_snapshot, p_system_identifier, p_moved_at,
            p_rebased_at, p_live_from, p_kept_from)
    RETURNING id INTO v_id;
    -- Older states have no use (a reader's snapshot still sees the ones it
    -- needs): delete them in batches, by key range.
    IF v_id % 256 = 0 THEN
        DELETE FROM outbox_cursor_states WHERE id < v_id - 64;
    END IF;
END
$$;

-- Where the cursor was when, at most one entry per second (inserted, never
-- updated: see outbox_cursor_states): when a stream row was published (to
-- the second), and what purge may delete.
CREATE TABLE IF NOT EXISTS outbox_cursor_log (
    position BIGINT PRIMARY KEY,
    at       TIMESTAMPTZ NOT NULL
);

-- A relay's claim. `held` (with `held_positions`) are the rows still in
-- flight, fenced by the token; `positions` every stream position the claim
-- took, kept until the cursor has passed them all (an acked stream row needs
-- no write of its own). `keys` are the partition keys still in flight: a key
-- with a row in flight waits whole.
CREATE TABLE IF NOT EXISTS outbox_leases (
    token          BIGSERIAL PRIMARY KEY,
    owner          TEXT NOT NULL,
    claimed_at     TIMESTAMPTZ NOT NULL,
    expires_at     TIMESTAMPTZ NOT NULL,
    held           BIGINT[] NOT NULL,
    held_positions BIGINT[] NOT NULL,
    tracked        BIGINT[] NOT NULL,
    positions      BIGINT[] NOT NULL,
    max_position   BIGINT NOT NULL,
    keys           TEXT[] NOT NULL,
    -- The one row of the lease under crash suspicion, if any.
    suspect        BIGINT,
    -- Claimed while an older lease of its owner was in flight (a relay's
    -- prefetch) when that one expired: its publishing never started.
    unstarted      BOOLEAN NOT NULL DEFAULT FALSE
);
-- A lease lives for one batch: compressing its arrays costs more than it saves.
ALTER TABLE outbox_leases ALTER COLUMN held SET STORAGE EXTERNAL;
ALTER TABLE outbox_leases ALTER COLUMN held_positions SET STORAGE EXTERNAL;
ALTER TABLE outbox_leases ALTER COLUMN positions SET STORAGE EXTERNAL;
ALTER TABLE outbox_leases ALTER COLUMN keys SET STORAGE EXTERNAL;
-- Leases come and go with every batch, and an open transaction anywhere on
-- the server keeps their dead versions: claims reach the live ones (and
-- those the cursor has not passed) by index from the watermark, never by
-- reading the heap. (An index of the live leases by expiry held every
-- emptied lease's dead entry below the time of day, and reaping read them
-- all while xmin was held.)
DROP INDEX IF EXISTS outbox_leases_live;
CREATE INDEX IF NOT EXISTS outbox_leases_held
    ON outbox_leases (token) WHERE cardinality(held) > 0;
CREATE INDEX IF NOT EXISTS outbox_leases_max_position
    ON outbox_leases (max_position);

CREATE TABLE IF NOT EXISTS outbox_attempts (
    id          BIGSERIAL PRIMARY KEY,
    event_id    UUID NOT NULL,
    kind        TEXT NOT NULL,
    at          TIMESTAMPTZ NOT NULL,
    actor       TEXT NOT NULL,
    error_class TEXT,
    detail      TEXT NOT NULL,
    attempts    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_attempts_event ON outbox_attempts (event_id, id);

CREATE TABLE IF NOT EXISTS outbox_inbox (
    consumer   TEXT NOT NULL,
    event_id   UUID NOT NULL,
    claimed_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS outbox_inbox_claimed_at ON outbox_inbox (claimed_at);

CREATE TABLE IF NOT EXISTS outbox_relays (
    relay     TEXT PRIMARY KEY,
    last_seen TIMESTAMPTZ NOT NULL,
    -- The relay host's clock at that moment minus the database's: shown to
    -- operators, never used for a lease.
    clock_skew_ms BIGINT NOT NULL DEFAULT 0,
    -- Set while the relay is paused because its publisher reports an
    -- outage: since when (database time), where it publishes, the latest
    -- error. Written by its heartbeats, read by status and health.
    outage_since       TIMESTAMPTZ,
    outage_destination TEXT,
    outage_reason      TEXT
);
ALTER TABLE outbox_relays ADD COLUMN IF NOT EXISTS outage_since TIMESTAMPTZ;
ALTER TABLE outbox_relays ADD COLUMN IF NOT EXISTS outage_destination TEXT;
ALTER TABLE outbox_relays ADD COLUMN IF NOT EXISTS outage_reason TEXT;

-- Wake idle relays on commit (a hint: polling stays the backstop), only
-- while a relay waits: a NOTIFY costs every committing transaction a
-- cluster-wide lock, which a busy relay does not need.
--
-- A producer whose insert read the flag just before a relay set it sends
-- no NOTIFY. So every inserting transaction first holds a shared advisory
-- lock (it never waits: producers share it and no relay ever asks for it);
-- a relay that has just set the flag sees the holders in pg_locks and
-- watches them until they end (outbox_watch_producers).
--
-- A transaction that will be prepared (two-phase commit) may not NOTIFY:
-- PREPARE TRANSACTION would fail. Such a producer says so with
-- `SET LOCAL outbox.notify = 'off'` before its insert; relays then find
-- its events by polling (README, "Two-phase commit").
CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(7107296362001212369);
    IF pg_sequence_last_value('outbox_relay_waiting') = 1
       AND current_setting('outbox.notify', true) IS DISTINCT FROM 'off' THEN
        PERFORM pg_notify('outbox_events', '');
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_events_notify ON outbox_events;
CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();

-- Enqueue from any language, with the same checks, ordering and delay
-- semantics as the Rust `enqueue` (README, "Enqueue from SQL"). Returns the
-- new row's sequence, or NULL when an event with this id exists (a no-op).
-- `p_partition_key` NULL (or left out) is the aggregate id, as a Rust
-- event built without `.partition_key(..)`: SQL cannot tell an explicit
-- NULL from a missing argument.
CREATE OR REPLACE FUNCTION outbox_enqueue(
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
        IF octet_length(v_value) > 255 THEN
            RAISE EXCEPTION 'outbox: event field `%` is % bytes, longer than the limit of 255',
                v_field, octet_length(v_value) USING ERRCODE = '22023';
        END IF;
    END LOOP;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'outbox: payload must not be null (use the JSON value null)' USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_payload::text) > 262144 THEN
        RAISE EXCEPTION 'outbox: payload is % bytes, larger than the limit of 262144',
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
        FROM jsonb_each(p_headers)) > 16384 THEN
        RAISE EXCEPTION 'outbox: headers are larger than the limit of 16384 bytes'
            USING ERRCODE = '22023';
    END IF;
    IF p_payload_version IS NULL OR p_payload_version < 0 THEN
        RAISE EXCEPTION 'outbox: payload_version must be a non-negative integer' USING ERRCODE = '22023';
    END IF;
    IF p_delay < interval '0' THEN
        RAISE EXCEPTION 'outbox: delay must not be negative' USING ERRCODE = '22023';
    END IF;
    INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type,
        partition_key, payload, payload_version, headers, available_at)
    VALUES (p_event_id, p_aggregate_type, p_aggregate_id, p_event_type, v_key, p_payload,
        p_payload_version, p_headers, outbox_now() + coalesce(p_delay, interval '0'))
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
CREATE OR REPLACE FUNCTION outbox_tick() RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    v_snapshot pg_snapshot := pg_current_snapshot();
    v_system   bigint := (SELECT system_identifier FROM pg_control_system());
    v_cursor   record;
    v_count    bigint;
BEGIN
    SELECT * INTO v_cursor FROM outbox_cursor_now;
    IF NOT FOUND THEN
        -- The first claim on these tables (see outbox_control).
        INSERT INTO outbox_control (id) VALUES (TRUE) ON CONFLICT (id) DO NOTHING;
        -- Tables of an earlier release kept the cursor in one row of
        -- outbox_cursor: go on from it.
        IF to_regclass('outbox_cursor') IS NOT NULL THEN
            INSERT INTO outbox_cursor_states
                (position, end_position, tick_snapshot, system_identifier, moved_at, rebased_at)
            SELECT position, end_position, tick_snapshot, system_identifier, moved_at, rebased_at
            FROM outbox_cursor;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM outbox_cursor_states) THEN
            INSERT INTO outbox_cursor_states DEFAULT VALUES;
        END IF;
        SELECT * INTO v_cursor FROM outbox_cursor_now;
    END IF;
    IF v_cursor.tick_snapshot IS NULL
       OR v_cursor.system_identifier IS DISTINCT FROM v_system
       OR pg_snapshot_xmax(v_snapshot) < pg_snapshot_xmax(v_cursor.tick_snapshot) THEN
        RETURN outbox_rebase(v_snapshot, v_system);
    END IF;
    WITH new_rows AS (
        SELECT e.sequence, e.partition_key, e.available_at FROM outbox_events e
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
        CROSS JOIN LATERAL (SELECT * FROM outbox_events y WHERE y.txid = x.id OFFSET 0) e
        WHERE e.status = 0 AND e.position IS NULL
    ), numbered AS (
        SELECT *, row_number() OVER (ORDER BY sequence) - 1 AS n FROM new_rows
    ), appended AS (
        INSERT INTO outbox_order (first_position, lo_sequence, hi_sequence, ticked_at,
                                            sequences, keys, available_at)
        SELECT v_cursor.end_position + min(n), min(sequence), max(sequence), outbox_now(),
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
        PERFORM outbox_cursor_write(v_cursor.position, v_cursor.end_position + v_count,
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
CREATE OR REPLACE FUNCTION outbox_rebase(p_snapshot pg_snapshot, p_system bigint)
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
    PERFORM outbox_sequences_past_rows();
    SELECT * INTO v_cursor FROM outbox_cursor_now;
    WITH ordered AS (
        SELECT unnest(sequences) AS sequence FROM outbox_order
    ), new_rows AS (
        SELECT e.sequence, e.partition_key, e.available_at FROM outbox_events e
        WHERE e.status = 0 AND e.position IS NULL
          AND NOT EXISTS (SELECT 1 FROM ordered o WHERE o.sequence = e.sequence)
    ), numbered AS (
        SELECT *, row_number() OVER (ORDER BY sequence) - 1 AS n FROM new_rows
    ), appended AS (
        INSERT INTO outbox_order (first_position, lo_sequence, hi_sequence, ticked_at,
                                            sequences, keys, available_at)
        SELECT v_cursor.end_position + min(n), min(sequence), max(sequence), outbox_now(),
               array_agg(sequence ORDER BY sequence), array_agg(partition_key ORDER BY sequence),
               array_agg(available_at ORDER BY sequence)
        FROM numbered GROUP BY n / 64
        RETURNING cardinality(sequences) AS appended
    ), settled AS (
        UPDATE outbox_events SET txid = '0'
        WHERE txid >= pg_snapshot_xmin(p_snapshot) AND NOT pg_visible_in_snapshot(txid, p_snapshot)
    )
    SELECT coalesce(sum(appended), 0) INTO v_count FROM appended;
    PERFORM outbox_cursor_write(v_cursor.position, v_cursor.end_position + v_count,
        p_snapshot, p_system, v_cursor.moved_at,
        CASE WHEN v_cursor.tick_snapshot IS NULL THEN v_cursor.rebased_at
             ELSE outbox_now() END,
        v_cursor.live_from, v_cursor.kept_from);
    IF v_cursor.tick_snapshot IS NOT NULL THEN
        RAISE LOG 'outbox: outbox_events is on another cluster (system identifier %): % events appended to claim order',
            p_system, v_count;
    END IF;
    RETURN v_count;
END
$$;

-- Index for unordered claims: tracked rows in claim order.
CREATE INDEX IF NOT EXISTS outbox_events_tracked_due
    ON outbox_events (position) WHERE status = 4;

-- Rows `p_rows` (at stream positions `p_positions`) of one lease ended
-- without an outcome after publishing may have started: they leave the
-- stream as suspects, judged as outbox_core::store::judge_crash says. The
-- crash counts on one row only when it is certain which (the lease's one
-- suspect, or a single row), and that row goes alone from now on; the
-- lease's other suspects crashed again together and go back in halves;
-- the rest crashed for the first time and go back together (a dead relay's
-- batch). `p_suspect` is the lease's one suspect, if it held one. Returns
-- how many rows it wrote.
CREATE OR REPLACE FUNCTION outbox_blame(p_rows bigint[], p_positions bigint[], p_suspect bigint)
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
    FROM outbox_events e WHERE e.sequence = ANY(p_rows) AND e.status IN (0, 4);
    v_culprit := CASE
        WHEN p_suspect IS NOT NULL AND p_suspect = ANY(p_rows) THEN p_suspect
        WHEN v_suspects = 1 THEN (SELECT e.sequence FROM outbox_events e
                                  WHERE e.sequence = ANY(p_rows) AND e.suspect LIMIT 1)
        WHEN cardinality(p_rows) = 1 THEN p_rows[1] END;
    WITH written AS (
        UPDATE outbox_events e
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
CREATE OR REPLACE FUNCTION outbox_return(p_rows bigint[], p_positions bigint[])
    RETURNS bigint
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_written bigint;
BEGIN
    UPDATE outbox_events e
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
CREATE OR REPLACE FUNCTION outbox_reap(p_now timestamptz) RETURNS bigint
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_written bigint;
BEGIN
    WITH old AS (
        SELECT l.token, l.owner, l.held, l.held_positions, l.suspect,
               l.unstarted OR EXISTS (
                   SELECT 1 FROM outbox_leases o
                   WHERE o.token >= outbox_live_from()
                     AND o.owner = l.owner AND o.token < l.token AND cardinality(o.held) > 0
               ) AS unstarted
        FROM outbox_leases l
        WHERE l.token >= outbox_live_from()
          AND l.expires_at <= p_now AND cardinality(l.held) > 0
        FOR UPDATE OF l
    ), marked AS (
        UPDATE outbox_leases y SET unstarted = TRUE
        FROM old
        WHERE y.token >= outbox_live_from()
          AND y.owner = old.owner AND y.token > old.token AND y.expires_at > p_now
          AND cardinality(y.held) > 0
    ), emptied AS (
        -- By token, probed: statistics of a table with a row or two live
        -- made this a scan of every lease joined afterwards, dead versions
        -- and all, on every claim while xmin was held.
        UPDATE outbox_leases l
        SET held = '{}', held_positions = '{}', tracked = '{}', keys = '{}', suspect = NULL
        WHERE l.token = ANY ((SELECT array_agg(token) FROM old)::bigint[])
    ), blamed AS (
        SELECT CASE WHEN old.unstarted
                    THEN outbox_return(old.held, old.held_positions)
                    ELSE outbox_blame(old.held, old.held_positions, old.suspect) END AS n
        FROM old
    )
    SELECT coalesce(sum(n), 0)::bigint INTO v_written FROM blamed;
    RETURN v_written;
END
$$;

-- Rows blamed for `p_limit` crashes, at the head of their key and not in
-- flight, end failed (a crash loop, DESIGN.md §4); under Block the rest of
-- the key is parked behind them.
CREATE OR REPLACE FUNCTION outbox_fail_crash_loops(
    p_now timestamptz, p_limit integer, p_block boolean, p_actor text)
    RETURNS SETOF bigint
    LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH looped AS (
        UPDATE outbox_events c
        SET status = 3, blocks_key = p_block, suspect = FALSE
        WHERE c.status = 4 AND c.unfinished_claims > 0 AND c.unfinished_claims >= p_limit
          AND c.sequence NOT IN (SELECT unnest(held) FROM outbox_leases
                                 WHERE token >= outbox_live_from() AND cardinality(held) > 0)
          AND NOT EXISTS (
              SELECT 1 FROM outbox_events p
              WHERE p.partition_key = c.partition_key AND (p.status IN (4, 5) OR p.blocks_key)
                AND p.position < c.position)
        RETURNING c.sequence, c.event_id, c.partition_key, c.position, c.attempts, c.unfinished_claims
    ), history AS (
        INSERT INTO outbox_attempts (event_id, kind, at, actor, error_class, detail, attempts)
        SELECT event_id, 'CrashLoop', p_now, p_actor, NULL,
               unfinished_claims || ' publish attempts started and none finished', attempts
        FROM looped
    ), parked AS (
        UPDATE outbox_events e SET status = 5
        FROM looped l
        WHERE p_block AND e.partition_key = l.partition_key AND e.status = 4 AND e.position > l.position
    )
    SELECT looped.sequence FROM looped;
END
$$;

-- The runs of claim order that hold positions [p_from, p_to): from the
-- one holding p_from (a run may start before it) to the last starting
-- before p_to. Every pick reads its window through this. A single
-- STABLE SELECT, so the planner inlines it into each caller's statement.
CREATE OR REPLACE FUNCTION outbox_window_runs(p_from bigint, p_to bigint)
    RETURNS TABLE (first_position bigint, sequences bigint[], keys text[],
                   available_at timestamptz[])
    LANGUAGE sql STABLE AS $$
    SELECT o.first_position, o.sequences, o.keys, o.available_at
    FROM outbox_order o
    WHERE o.first_position >= (SELECT coalesce(max(x.first_position), 0)
                               FROM outbox_order x WHERE x.first_position <= p_from)
      AND o.first_position < p_to
$$;

-- A key's first `p_limit` lane rows not yet taken, in claim order, with
-- the entry each comes from and its index there: only the entries a batch
-- can take from are read (by their sizes), each sliced to it. Both picks
-- take a key's lanes through this; inlined as outbox_window_runs is.
CREATE OR REPLACE FUNCTION outbox_lane_head(p_key text, p_limit integer)
    RETURNS TABLE (sequence bigint, claim_position bigint, lane bigint, lane_index integer)
    LANGUAGE sql STABLE AS $$
    SELECT u.sequence, u.position, l.first_position, l.taken + u.i::integer
    FROM (SELECT z.* FROM (
              SELECT z.*, sum(z.size - z.taken) OVER (ORDER BY z.first_position) AS upto
              FROM (SELECT * FROM outbox_lanes z
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
CREATE OR REPLACE FUNCTION outbox_lanes_take(
    p_keys text[], p_lanes bigint[], p_taken integer[]) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    WITH took AS (
        SELECT * FROM unnest(p_keys, p_lanes, p_taken) AS t(partition_key, lane, upto)
    ), advanced AS (
        UPDATE outbox_lanes l SET taken = t.upto
        FROM took t
        WHERE l.partition_key = t.partition_key AND l.first_position = t.lane
          AND t.upto < l.size
    )
    DELETE FROM outbox_lanes l
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
DROP FUNCTION IF EXISTS outbox_pick(timestamptz, bigint, bigint, integer, boolean);
DROP FUNCTION IF EXISTS outbox_pick(timestamptz, bigint, bigint, integer, boolean, boolean);
CREATE OR REPLACE FUNCTION outbox_pick(
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
        SELECT DISTINCT e.partition_key AS key FROM outbox_events e
        WHERE p_ordered AND e.status = 4 AND e.available_at <= p_now
    ), live_leases AS MATERIALIZED (
        SELECT l.held, l.keys, l.claimed_at FROM outbox_leases l
        WHERE l.token >= outbox_live_from() AND cardinality(l.held) > 0
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
        FROM outbox_lanes
        WHERE p_ordered AND ready_at <= p_now
          AND partition_key NOT IN (SELECT key FROM live_keys)
        GROUP BY partition_key
    ), taken AS (
        SELECT unnest(positions) AS position FROM outbox_leases
        WHERE token >= outbox_kept_from() AND max_position >= p_from
    ), window_rows AS (
        -- Decided on the runs alone: every stream position a claim dealt
        -- with beyond the cursor (picked, or deferred) is in a lease's
        -- positions until the cursor passes it.
        SELECT w.position, w.sequence, w.partition_key, w.available_at <= p_now AS due
        FROM (SELECT o.first_position + u.i - 1 AS position, u.sequence, u.partition_key,
                     u.available_at
              FROM outbox_window_runs(p_from, p_to) o
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
          AND EXISTS (SELECT 1 FROM outbox_events e
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
                   (SELECT min(z.first_position) FROM outbox_lanes z
                    WHERE z.partition_key = t.key) AS lanes_from
            FROM outbox_events e
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
                 FROM outbox_events e
                 WHERE e.partition_key = t.key AND (e.status = 4 OR e.blocks_key)
                 ORDER BY e.position LIMIT p_limit)
                UNION ALL
                SELECT h.sequence, t.key, h.claim_position, FALSE, 0, FALSE, TRUE, h.lane, h.lane_index
                FROM outbox_lane_head(t.key,
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
              FROM outbox_events e
              WHERE NOT p_ordered AND e.status = 4 AND e.available_at <= p_now
                AND e.sequence NOT IN (SELECT sequence FROM live_rows)
              ORDER BY e.position LIMIT p_limit) x
        UNION ALL
        -- Unordered claims take lane rows too (lanes are written only by
        -- per-key claims; a relay switched to unordered finds them).
        SELECT x.sequence, x.partition_key, x.position, FALSE, 0, TRUE, x.lane, x.lane_index
        FROM (SELECT u.sequence, l.partition_key, u.position, l.first_position AS lane,
                     l.taken + u.i::integer AS lane_index
              FROM (SELECT * FROM outbox_lanes z WHERE NOT p_ordered
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
                        SELECT 1 FROM (SELECT o.keys FROM outbox_order o
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
        UPDATE outbox_events e SET status = d.new_status, position = d.position
        FROM left_out d
        WHERE e.sequence = d.sequence AND d.new_status IS NOT NULL AND NOT d.laned
          AND e.status = 0
    ), laned AS (
        -- One entry per key and 1,024 positions of the window (a claim of
        -- the key reads the entries it takes from whole: they stay small).
        INSERT INTO outbox_lanes (partition_key, first_position, sequences, positions, size,
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
        PERFORM outbox_lanes_take(v_lane_keys, v_lanes, v_taken);
    END IF;
END
$$;

-- Whether one of `p_keys` waits outside the stream: a tracked row or a
-- blocking row of the key (its parked rows are behind the latter). The
-- plain pick gives way to the general one for those keys only where it
-- decides (see outbox_pick_plain).
CREATE OR REPLACE FUNCTION outbox_keys_wait(p_keys text[]) RETURNS boolean
    LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM unnest(p_keys) AS k(key)
                   WHERE EXISTS (SELECT 1 FROM outbox_events e
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
CREATE OR REPLACE FUNCTION outbox_pick_plain(
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
    IF EXISTS (SELECT 1 FROM outbox_events e
               WHERE e.status = 4 AND e.available_at <= p_now) THEN
        RETURN;
    END IF;
    v_live_keys := ARRAY(SELECT DISTINCT unnest(l.keys) FROM outbox_leases l
                         WHERE p_ordered AND l.token >= outbox_live_from()
                           AND cardinality(l.held) > 0);
    -- Lanes are taken here only by per-key claims (an unordered claim
    -- takes every key's lanes, in claim order: the general pick's way).
    IF NOT p_ordered AND EXISTS (SELECT 1 FROM outbox_lanes) THEN
        RETURN;
    END IF;
    -- Whether every row is due is asked of the runs the window touches: a
    -- row not due in any of them sends the claim to the general pick.
    IF EXISTS (SELECT 1 FROM outbox_window_runs(p_from, p_to) o
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
       AND NOT EXISTS (SELECT 1 FROM outbox_lanes z WHERE z.ready_at <= p_now)
       AND NOT EXISTS (SELECT 1 FROM outbox_leases
                       WHERE token >= outbox_kept_from() AND max_position >= p_from) THEN
        WITH runs AS MATERIALIZED (
            SELECT o.first_position, o.sequences, o.keys, p_now >= ALL (o.available_at) AS due
            FROM outbox_window_runs(p_from, p_to) o
        ), firsts AS MATERIALIZED (
            -- One row past the batch: where the cursor stops after a full one.
            SELECT r.first_position + u.i - 1 AS position, u.sequence, u.partition_key
            FROM runs r
            CROSS JOIN LATERAL unnest(r.sequences, r.keys) WITH ORDINALITY AS u(sequence, partition_key, i)
            WHERE r.first_position + u.i - 1 >= p_from AND r.first_position + u.i - 1 < p_to
            ORDER BY 1 LIMIT p_limit + 1
        ), applies AS MATERIALIZED (
            SELECT NOT EXISTS (SELECT 1 FROM outbox_events e
                               WHERE e.status = 4 AND e.available_at <= p_now)
               AND (NOT p_ordered
                    OR NOT EXISTS (SELECT 1 FROM outbox_events e
                                   WHERE e.status = 4 OR e.blocks_key)
                    OR NOT outbox_keys_wait(ARRAY(SELECT DISTINCT f.partition_key
                                                             FROM firsts f)))
               AND NOT EXISTS (SELECT 1 FROM outbox_lanes z WHERE z.ready_at <= p_now)
               AND (p_ordered OR NOT EXISTS (SELECT 1 FROM outbox_lanes))
               AND NOT EXISTS (SELECT 1 FROM outbox_leases l
                               WHERE p_ordered AND l.token >= outbox_live_from()
                                 AND cardinality(l.held) > 0 AND cardinality(l.keys) > 0)
               AND NOT EXISTS (SELECT 1 FROM outbox_leases
                               WHERE token >= outbox_kept_from() AND max_position >= p_from)
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
                    ELSE EXISTS (SELECT 1 FROM (SELECT o.keys FROM outbox_order o
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
        SELECT l.keys, l.claimed_at FROM outbox_leases l
        WHERE p_ordered AND l.token >= outbox_live_from() AND cardinality(l.held) > 0
    ), live_keys AS MATERIALIZED (
        SELECT DISTINCT unnest(keys) AS key FROM live_leases
    ), young_keys AS MATERIALIZED (
        SELECT DISTINCT unnest(keys) AS key FROM live_leases
        WHERE claimed_at > p_now - interval '1 second'
    ), taken AS (
        SELECT unnest(positions) AS position FROM outbox_leases
        WHERE token >= outbox_kept_from() AND max_position >= p_from
    ), runs AS MATERIALIZED (
        SELECT o.first_position, o.sequences, o.keys, p_now >= ALL (o.available_at) AS due
        FROM outbox_window_runs(p_from, p_to) o
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
        FROM outbox_lanes
        WHERE p_ordered AND ready_at <= p_now AND partition_key NOT IN (SELECT key FROM live_keys)
        GROUP BY partition_key
    ), lane_rows AS MATERIALIZED (
        -- Per such key its first lane rows.
        SELECT x.* FROM lane_keys t CROSS JOIN LATERAL (
            SELECT h.sequence, t.partition_key, h.claim_position AS position, h.lane, h.lane_index
            FROM outbox_lane_head(t.partition_key, p_limit) h
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
        SELECT NOT EXISTS (SELECT 1 FROM outbox_events e
                           WHERE e.status = 4 AND e.available_at <= p_now)
           AND (NOT p_ordered
                OR NOT EXISTS (SELECT 1 FROM outbox_events e
                               WHERE e.status = 4 OR e.blocks_key)
                OR NOT outbox_keys_wait(ARRAY(
                       SELECT s.partition_key FROM stream s
                       WHERE s.position <= coalesce((SELECT cut FROM picked), p_to)
                       UNION
                       SELECT partition_key FROM lane_keys)))
           AND NOT (NOT p_ordered AND EXISTS (SELECT 1 FROM outbox_lanes))
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
                        SELECT 1 FROM (SELECT o.keys FROM outbox_order o
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
        INSERT INTO outbox_lanes (partition_key, first_position, sequences, positions, size)
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
        PERFORM outbox_lanes_take(v_lane_keys, v_lanes, v_taken);
    END IF;
END
$$;

-- A claim: one relay at a time per table (the advisory lock; producers
-- never take it), on the database clock. Reaps expired leases, fails crash
-- loops, ticks, then picks from the cursor window by window until it has
-- something or the stream ends; leases the picks under a new token and
-- moves the cursor. Crash-looped rows come first, flagged `crash_looped`.
DROP FUNCTION IF EXISTS outbox_claim(text, integer, interval, integer, boolean, boolean);
CREATE OR REPLACE FUNCTION outbox_claim(
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
    PERFORM pg_advisory_xact_lock(7107296361856136764);
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Planned once per connection: custom plans of these statements cost
    -- more to make than to run.
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    v_now := outbox_now();
    IF pg_sequence_last_value('outbox_relay_waiting') = 1 THEN
        PERFORM setval('outbox_relay_waiting', 0);
    END IF;
    PERFORM outbox_reap(v_now);
    -- Rows are read by primary key, one lateral probe each, whatever the
    -- planner guesses of an array's length or the table's size (a LIMIT
    -- keeps the probe from being turned into a join that scans the index).
    RETURN QUERY
        SELECT TRUE, e.sequence, e.event_id, e.aggregate_type, e.aggregate_id, e.event_type,
               e.partition_key, e.payload::text, e.payload_version, e.headers::text, e.created_at,
               e.available_at, e.attempts, NULL::bigint, NULL::timestamptz
        FROM outbox_fail_crash_loops(v_now, p_crash_loop_limit, p_block, p_owner) AS f(s)
        CROSS JOIN LATERAL (SELECT * FROM outbox_events x WHERE x.sequence = f.s LIMIT 1) e;
    PERFORM outbox_tick();
    v_now := outbox_clock();
    SELECT * INTO v_state FROM outbox_cursor_now;
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
    DELETE FROM outbox_leases
    WHERE token >= v_state.kept_from AND token < v_state.live_from
      AND max_position + 0 < v_cursor;
    v_live_from := coalesce(
        (SELECT min(token) FROM outbox_leases
         WHERE token >= v_state.live_from AND cardinality(held) > 0),
        -- From the watermark, as every read of the leases: with no lease
        -- live, the newest ones are dead versions a held xmin keeps.
        (SELECT max(token) + 1 FROM outbox_leases WHERE token >= v_state.live_from),
        v_state.live_from);
    v_kept_from := least(v_live_from, coalesce(
        (SELECT min(token) FROM outbox_leases WHERE token >= v_state.kept_from),
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
    v_hint := (SELECT last_value FROM outbox_pass_window);
    v_window := greatest(v_window, v_hint);
    v_from := v_cursor;
    v_stop := v_cursor;
    v_round := 0;
    LOOP
        v_round := v_round + 1;
        v_to := least(v_end, v_from + v_window
            + (SELECT count(*) FROM outbox_leases l CROSS JOIN LATERAL unnest(l.positions) AS p
               WHERE l.token >= v_kept_from AND l.max_position >= v_from AND p >= v_from));
        v_plain_pick := FALSE;
        IF v_plain THEN
            SELECT * INTO v_pick
            FROM outbox_pick_plain(v_now, v_from, v_to, p_limit, p_ordered, v_defer);
            v_plain_pick := v_pick.stop IS NOT NULL;
            -- Not the plain case: the general pick for the rest of this claim.
            v_plain := v_plain_pick;
        END IF;
        IF NOT v_plain_pick THEN
            SELECT * INTO v_pick
            FROM outbox_pick(v_now, v_from, v_to, p_limit, p_ordered, v_defer);
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
        PERFORM setval('outbox_pass_window', v_next);
    END IF;
    IF v_stop > v_cursor OR v_live_from <> v_state.live_from OR v_kept_from <> v_state.kept_from THEN
        PERFORM outbox_cursor_write(greatest(v_stop, v_cursor), v_state.end_position,
            v_state.tick_snapshot, v_state.system_identifier,
            CASE WHEN v_stop > v_cursor THEN v_now ELSE v_state.moved_at END,
            v_state.rebased_at, v_live_from, v_kept_from);
    END IF;
    IF v_stop > v_cursor THEN
        IF coalesce((SELECT g.at FROM outbox_cursor_log g ORDER BY g.position DESC LIMIT 1),
                    '-infinity') <= v_now - interval '1 second' THEN
            INSERT INTO outbox_cursor_log (position, at) VALUES (v_stop, v_now)
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
    INSERT INTO outbox_leases (owner, claimed_at, expires_at, held, held_positions, tracked,
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
            FROM outbox_events e
            WHERE e.sequence BETWEEN v_first AND v_first + cardinality(v_pick.sequences) - 1
            ORDER BY e.sequence;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT FALSE, e.sequence, e.event_id, e.aggregate_type, e.aggregate_id, e.event_type,
               e.partition_key, e.payload::text, e.payload_version, e.headers::text, e.created_at,
               e.available_at, e.attempts, v_token, v_expires
        FROM unnest(v_pick.sequences) WITH ORDINALITY AS u(s, i)
        CROSS JOIN LATERAL (SELECT * FROM outbox_events x WHERE x.sequence = u.s LIMIT 1) e
        ORDER BY u.i;
END
$$;

-- Rows a settlement takes out of their leases: each (sequence, token) the
-- lease `token` still holds, with its position; the leases are locked (a
-- claim that would reap them waits, or already has: fenced) and keep the
-- rest. A stream row acked needs no write of its own: its lease keeps its
-- position until the cursor has passed it.
DROP FUNCTION IF EXISTS outbox_take(bigint[], bigint[]);
CREATE OR REPLACE FUNCTION outbox_take(p_sequences bigint[], p_tokens bigint[])
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
        FROM outbox_leases l WHERE l.token = p_tokens[1]
        FOR UPDATE;
        IF FOUND AND cardinality(v_lease.held) = cardinality(p_sequences)
           AND (v_lease.held = p_sequences
                OR ARRAY(SELECT x FROM unnest(v_lease.held) AS x ORDER BY x)
                   = ARRAY(SELECT x FROM unnest(p_sequences) AS x ORDER BY x)) THEN
            UPDATE outbox_leases l
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
        FROM outbox_leases l
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
        UPDATE outbox_leases l
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

-- Acks: rows that had left the stream are written published; stream rows
-- are published by their lease's positions and the cursor. Returns the
-- sequences settled (the rest were fenced off).
CREATE OR REPLACE FUNCTION outbox_ack(p_sequences bigint[], p_tokens bigint[])
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
    FROM outbox_take(p_sequences, p_tokens) AS t;
    IF v_tracked IS NOT NULL THEN
        UPDATE outbox_events
        SET status = 2, published_at = outbox_now(), unfinished_claims = 0, suspect = FALSE
        WHERE sequence = ANY(v_tracked);
    END IF;
    RETURN QUERY SELECT unnest(v_rows);
END
$$;

-- Failed attempts: retry later (status 4, available after the backoff on
-- the database clock) or fail (status 3; blocking parks the key's later
-- tracked rows). History is appended. Returns the sequences settled.
CREATE OR REPLACE FUNCTION outbox_nack(
    p_sequences bigint[], p_tokens bigint[], p_retry_after_ms bigint[], p_block boolean[],
    p_kinds text[], p_classes text[], p_errors text[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := outbox_now();
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    RETURN QUERY
    WITH input AS (
        SELECT * FROM unnest(p_sequences, p_tokens, p_retry_after_ms, p_block, p_kinds, p_classes, p_errors)
            AS i(sequence, token, retry_after_ms, block, kind, class, error)
    ), taken AS (
        SELECT t.*, i.retry_after_ms, i.block, i.kind, i.class, i.error
        FROM outbox_take(p_sequences, p_tokens) AS t
        JOIN input i ON i.sequence = t.sequence AND i.token = t.token
    ), settled AS (
        UPDATE outbox_events e
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
        INSERT INTO outbox_attempts (event_id, kind, at, actor, error_class, detail, attempts)
        SELECT event_id, kind, v_now, owner, class, error, attempts FROM settled
    ), parked AS (
        UPDATE outbox_events p SET status = 5
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
CREATE OR REPLACE FUNCTION outbox_release(
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
    FROM outbox_leases WHERE token = ANY(p_tokens);
    SELECT array_agg(t.sequence ORDER BY t.sequence), array_agg(t.token ORDER BY t.sequence),
           array_agg(t.claim_position ORDER BY t.sequence), array_agg(i.started ORDER BY t.sequence)
    INTO v_rows, v_tokens, v_positions, v_started
    FROM outbox_take(p_sequences, p_tokens) AS t
    JOIN unnest(p_sequences, p_tokens, p_started) AS i(sequence, token, started)
      ON i.sequence = t.sequence AND i.token = t.token;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    -- Stream rows leave the stream. A row already out of it (tracked, as
    -- a released head is when claimed again) keeps its one version: an
    -- unchanged rewrite is still a new version, and while a report holds
    -- xmin every one stays for later claims to step through.
    UPDATE outbox_events e
    SET status = 4, position = coalesce(e.position, u.position)
    FROM unnest(v_rows, v_positions, v_started) AS u(sequence, position, started)
    WHERE e.sequence = u.sequence AND NOT u.started AND e.status = 0;
    FOR v_token IN
        SELECT DISTINCT u.token FROM unnest(v_tokens, v_started) AS u(token, started) WHERE u.started
    LOOP
        PERFORM outbox_blame(
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
CREATE OR REPLACE FUNCTION outbox_anything_to_do() RETURNS boolean
    LANGUAGE plpgsql STABLE SET jit = off SET enable_seqscan = off SET enable_bitmapscan = off
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM outbox_cursor_now;
    -- Each probe is an index probe (ORDER BY ... LIMIT 1), whatever the
    -- planner guesses of a bound it cannot see.
    RETURN c.end_position > c.position
        OR c.tick_snapshot IS NULL
        OR c.system_identifier IS DISTINCT FROM (SELECT system_identifier FROM pg_control_system())
        OR EXISTS (SELECT 1 FROM outbox_events e
                   WHERE e.txid >= pg_snapshot_xmax(c.tick_snapshot) AND e.status = 0
                     AND e.position IS NULL
                   ORDER BY e.txid LIMIT 1)
        OR EXISTS (SELECT 1 FROM pg_snapshot_xip(c.tick_snapshot) AS x(id)
                   CROSS JOIN LATERAL (SELECT 1 FROM outbox_events e
                                       WHERE e.txid = x.id AND e.status = 0
                                         AND e.position IS NULL LIMIT 1) e)
        OR EXISTS (SELECT 1 FROM outbox_events
                   WHERE status = 4 AND available_at <= outbox_now()
                   ORDER BY position LIMIT 1)
        OR EXISTS (SELECT 1 FROM outbox_lanes l
                   WHERE l.partition_key NOT IN (
                       SELECT unnest(x.keys) FROM outbox_leases x
                       WHERE x.token >= c.live_from AND cardinality(x.held) > 0)
                   ORDER BY l.partition_key, l.first_position LIMIT 1)
        OR EXISTS (SELECT 1 FROM outbox_leases
                   WHERE token >= c.live_from
                     AND expires_at <= outbox_now() AND cardinality(held) > 0
                   ORDER BY token LIMIT 1);
END
$$;

-- Producer transactions (virtual transaction ids) that inserted events and
-- are still open, of `p_watched` (all, if NULL), then whether anything is
-- claimable, read with a later snapshot than the locks: a producer gone
-- from the locks has committed or rolled back before that snapshot, so its
-- rows are seen (locks are released after the commit is visible).
CREATE OR REPLACE FUNCTION outbox_watch_producers(p_watched text[])
    RETURNS TABLE (in_flight text[], anything boolean)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_in_flight text[];
BEGIN
    SELECT coalesce(array_agg(l.virtualtransaction), '{}') INTO v_in_flight
    FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = 1654796386 AND l.objid = 2592220113 AND l.objsubid = 1
      AND (p_watched IS NULL OR l.virtualtransaction = ANY(p_watched));
    RETURN QUERY SELECT v_in_flight, outbox_anything_to_do();
END
$$;

-- Stream rows the cursor has not passed and no claim took (pending in
-- claim order), lane rows not yet taken, and committed rows no tick has
-- ordered yet: together with the tracked rows, every pending event,
-- however the table got here.
-- Admin reads build on it, so it costs what is waiting, never what is
-- retained: published stream rows stay status 0 until purged, so rows not
-- yet ticked are found by transaction id (the two probes a tick makes),
-- never by status. Planned for indexes whatever the statistics say (a
-- history loaded since the last ANALYZE looked empty to the planner).
CREATE OR REPLACE FUNCTION outbox_stream_pending() RETURNS SETOF bigint
    LANGUAGE plpgsql STABLE SET jit = off SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0 AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM outbox_cursor_now;
    RETURN QUERY
        WITH taken AS (
            SELECT unnest(l.positions) AS position FROM outbox_leases l
            WHERE l.token >= c.kept_from AND l.max_position >= c.position
        ), held AS (
            SELECT unnest(held) AS sequence FROM outbox_leases
            WHERE token >= c.live_from AND cardinality(held) > 0
        )
        SELECT u.sequence
        FROM outbox_order o
        CROSS JOIN LATERAL unnest(o.sequences) WITH ORDINALITY AS u(sequence, i)
        WHERE o.first_position >= (SELECT coalesce(max(first_position), 0) FROM outbox_order
                                   WHERE first_position <= c.position)
          AND o.first_position + u.i - 1 >= c.position
          AND o.first_position + u.i - 1 NOT IN (SELECT position FROM taken)
          AND u.sequence NOT IN (SELECT sequence FROM held);
    -- A lane row leased is out of its lane (in the same transaction).
    RETURN QUERY
        SELECT unnest(l.sequences[l.taken + 1 :]) FROM outbox_lanes l;
    IF c.tick_snapshot IS NOT NULL
       AND c.system_identifier = (SELECT system_identifier FROM pg_control_system()) THEN
        RETURN QUERY
            SELECT e.sequence FROM outbox_events e
            WHERE e.txid >= pg_snapshot_xmax(c.tick_snapshot) AND e.status = 0 AND e.position IS NULL;
        RETURN QUERY
            SELECT e.sequence
            FROM (SELECT x.id FROM pg_snapshot_xip(c.tick_snapshot) AS x(id) OFFSET 0) x
            CROSS JOIN LATERAL (SELECT y.sequence FROM outbox_events y
                                WHERE y.txid = x.id AND y.status = 0 AND y.position IS NULL
                                OFFSET 0) e;
    ELSE
        -- Never ticked, or on another cluster: every stream row not in
        -- claim order (the next claim rebases; until then this reads the
        -- table once).
        RETURN QUERY
            SELECT e.sequence FROM outbox_events e
            WHERE e.status = 0 AND e.position IS NULL
              AND NOT EXISTS (SELECT 1 FROM outbox_order o
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
DROP FUNCTION IF EXISTS outbox_stats();
CREATE FUNCTION outbox_stats()
    RETURNS TABLE (event_type text, claimable bigint, oldest timestamptz, parked bigint,
                   in_flight bigint, failed bigint, now timestamptz, blocked bigint)
    LANGUAGE sql STABLE SET jit = off SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0 AS $$
    WITH held AS (
        SELECT unnest(held) AS sequence FROM outbox_leases
        WHERE token >= outbox_live_from() AND cardinality(held) > 0
    ), blocked_keys AS (
        SELECT DISTINCT b.partition_key FROM outbox_events b
        WHERE b.status = 3 AND b.blocks_key
    ), open AS (
        SELECT e.event_type, e.partition_key, e.status, e.available_at, FALSE AS in_flight
        FROM outbox_stream_pending() AS p(sequence)
        CROSS JOIN LATERAL (SELECT x.event_type, x.partition_key, x.status, x.available_at
                            FROM outbox_events x
                            WHERE x.sequence = p.sequence AND x.status = 0 LIMIT 1) e
        UNION ALL
        SELECT e.event_type, e.partition_key, e.status, e.available_at, TRUE
        FROM held h
        CROSS JOIN LATERAL (SELECT x.event_type, x.partition_key, x.status, x.available_at
                            FROM outbox_events x WHERE x.sequence = h.sequence LIMIT 1) e
        UNION ALL
        SELECT e.event_type, e.partition_key, e.status, e.available_at, FALSE
        FROM outbox_events e
        WHERE e.status IN (4, 5) AND e.sequence NOT IN (SELECT sequence FROM held)
    ), classified AS MATERIALIZED (
        -- Materialized: each row's blocked flag is asked once, not once per
        -- count that reads it (four hashed lookups a row, 68 ms to 41
        -- beside 10,000 blocked keys).
        SELECT o.*, o.status <> 3 AND NOT o.in_flight
                    AND o.partition_key IN (SELECT partition_key FROM blocked_keys) AS blocked
        FROM open o
    ), now AS (SELECT outbox_now() AS at
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
        SELECT f.event_type, count(*) AS failed FROM outbox_events f
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
CREATE OR REPLACE FUNCTION outbox_blocked_keys()
    RETURNS TABLE (partition_key text, event_id uuid, backlog bigint)
    LANGUAGE sql STABLE SET jit = off SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0 AS $$
    WITH blocked AS (
        SELECT DISTINCT ON (b.partition_key) b.partition_key, b.event_id
        FROM outbox_events b WHERE b.status = 3 AND b.blocks_key
        ORDER BY b.partition_key, b.position
    ), stream_keys AS MATERIALIZED (
        -- Counted per key first, then matched to the blocked keys once:
        -- asked of each row, the blocked keys were hashed again for every
        -- stream row (10,000 blocked keys, 100,000 stream rows: 81 s).
        SELECT e.partition_key, count(*) AS n
        FROM outbox_stream_pending() AS p(sequence)
        CROSS JOIN LATERAL (SELECT x.partition_key FROM outbox_events x
                            WHERE x.sequence = p.sequence AND x.status = 0 LIMIT 1) e
        GROUP BY e.partition_key
    ), waiting AS (
        SELECT k.partition_key, k.n FROM stream_keys k JOIN blocked b USING (partition_key)
        UNION ALL
        -- Tracked and parked rows counted per key in one pass over their
        -- index, then matched to the blocked keys: a count per blocked key
        -- cost 10,000 probes beside 10,000 blocked keys (86 ms of `status`
        -- to 44).
        SELECT y.partition_key, count(*) AS n FROM outbox_events y
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
CREATE OR REPLACE FUNCTION outbox_held_back()
    RETURNS TABLE (blocked_keys bigint, blocked_waiting bigint, backoff_keys bigint,
                   backoff_waiting bigint, next_due timestamptz, expired_leases bigint,
                   expired_events bigint, first_expired_at timestamptz, long_owners text[],
                   long_events bigint, long_claimed_at timestamptz, long_expires_at timestamptz,
                   suspects bigint)
    LANGUAGE sql STABLE SET jit = off SET enable_seqscan = off
    SET max_parallel_workers_per_gather = 0 AS $$
    WITH now AS (SELECT outbox_now() AS at),
    blocked AS (SELECT * FROM outbox_blocked_keys()),
    held AS (
        SELECT unnest(held) AS sequence FROM outbox_leases
        WHERE token >= outbox_live_from() AND cardinality(held) > 0
    ),
    -- Every pending row not in flight: stream rows no claim took (a delayed
    -- event waits there until a claim meets it), tracked and parked rows.
    pending AS (
        SELECT x.partition_key, x.available_at
        FROM outbox_stream_pending() AS p(sequence)
        CROSS JOIN LATERAL (SELECT y.partition_key, y.available_at FROM outbox_events y
                            WHERE y.sequence = p.sequence AND y.status = 0 LIMIT 1) x
        UNION ALL
        SELECT e.partition_key, e.available_at FROM outbox_events e
        WHERE e.status IN (4, 5) AND e.sequence NOT IN (SELECT sequence FROM held)
    ),
    -- Keys waiting on a retry backoff or a requested delay; the events
    -- behind them (due or not) wait too.
    backoff AS (
        SELECT p.partition_key, min(p.available_at) AS due FROM pending p, now
        WHERE p.available_at > now.at GROUP BY p.partition_key
    ), expired AS (
        SELECT l.* FROM outbox_leases l, now
        WHERE l.token >= outbox_live_from()
          AND l.expires_at <= now.at AND cardinality(l.held) > 0
    ), long AS (
        SELECT l.* FROM outbox_leases l, now
        WHERE l.token >= outbox_live_from() AND l.expires_at > now.at AND l.claimed_at < now.at - interval '5 seconds'
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
        (SELECT count(*) FROM outbox_events WHERE status = 4 AND suspect)
$$;

-- Sequences travel neither with logical replication nor with every copy
-- of a database: bring each past the rows it numbered, so producers and
-- claims on a new primary never collide with rows that came with the data.
-- Each sequence is read by name alone: scanning pg_sequences would look up
-- every sequence of the database, and fail ("schema … does not exist")
-- when another session drops one of them meanwhile.
CREATE OR REPLACE FUNCTION outbox_sequences_past_rows() RETURNS void
    LANGUAGE sql AS $$
    SELECT setval('outbox_events_seq', x.m)
    FROM (SELECT max(sequence) AS m FROM outbox_events) x, outbox_events_seq s
    WHERE x.m > s.last_value;
    SELECT setval(pg_get_serial_sequence('outbox_leases', 'token'), x.m)
    FROM (SELECT max(token) AS m FROM outbox_leases) x
    WHERE x.m > coalesce(pg_sequence_last_value(
                     pg_get_serial_sequence('outbox_leases', 'token')::regclass), 0);
    SELECT setval(pg_get_serial_sequence('outbox_attempts', 'id'), x.m)
    FROM (SELECT max(id) AS m FROM outbox_attempts) x
    WHERE x.m > coalesce(pg_sequence_last_value(
                     pg_get_serial_sequence('outbox_attempts', 'id')::regclass), 0);
    SELECT setval(pg_get_serial_sequence('outbox_cursor_states', 'id'), x.m)
    FROM (SELECT max(id) AS m FROM outbox_cursor_states) x
    WHERE x.m > coalesce(pg_sequence_last_value(
                     pg_get_serial_sequence('outbox_cursor_states', 'id')::regclass), 0);
$$;
SELECT outbox_sequences_past_rows();

-- Applied: what the next migrate() compares against.
DELETE FROM outbox_schema_applied;
INSERT INTO outbox_schema_applied (fingerprint) VALUES ('4dc2aaa93e941247');
