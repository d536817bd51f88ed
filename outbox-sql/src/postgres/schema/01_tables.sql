-- outbox schema for PostgreSQL (>= 13: xid8, pg_snapshot). Rendered with the
-- configured names and limits; the file in migrations/postgres/ is this
-- template with the defaults. README.md ("How the PostgreSQL store works")
-- explains the design; the comments here say what each piece is for.

-- Which version of this schema the tables are (migrate() refuses tables of
-- another version with an error naming the upgrade notes).
CREATE TABLE IF NOT EXISTS {{schema}}outbox_schema_version (version INTEGER NOT NULL);
INSERT INTO {{schema}}outbox_schema_version (version)
    SELECT {{schema_version}} WHERE NOT EXISTS (SELECT 1 FROM {{schema}}outbox_schema_version);

-- What migrate() last applied: a fingerprint of this rendered text (the
-- last statements below write it). A migrate() that finds its own
-- fingerprint runs none of this DDL, so it takes no lock a producer could
-- queue behind; deploys call it at every start.
CREATE TABLE IF NOT EXISTS {{schema}}outbox_schema_applied (fingerprint TEXT NOT NULL);

CREATE SEQUENCE IF NOT EXISTS {{schema}}outbox_events_seq;

-- Store time: the database clock (every lease, delay, backoff and age is
-- measured on it, so relay and producer hosts may disagree with each other),
-- shifted only by tests (`clock_shift`). `relay_waiting` is no longer
-- read or written (the flag below replaced it); it stays so that relays of
-- the previous version keep running through a rolling deploy.
CREATE TABLE IF NOT EXISTS {{schema}}outbox_control (
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
CREATE SEQUENCE IF NOT EXISTS {{schema}}outbox_relay_waiting MINVALUE 0 MAXVALUE 1 START 0;
GRANT SELECT, UPDATE ON SEQUENCE {{schema}}outbox_relay_waiting TO PUBLIC;

-- The small functions reading store time and the lease watermarks are
-- PL/pgSQL, not SQL: a SQL function with a sub-select is not inlined, and
-- each call was planned anew (27 to 52 us of planning for 7 to 11 us of
-- work: twice per enqueue, several times per claim); PL/pgSQL keeps its
-- plan for the connection.
CREATE OR REPLACE FUNCTION {{schema}}outbox_now() RETURNS timestamptz
    LANGUAGE plpgsql STABLE AS
$$ BEGIN RETURN now() + coalesce((SELECT clock_shift FROM {{schema}}outbox_control), interval '0'); END $$;

-- Store time at this instant (not at the transaction's start): claims read
-- it after they took their turn and ticked, so every row the tick ordered
-- is due unless it was delayed. (With the transaction's start, rows
-- committed while a claim waited for its turn looked delayed and left the
-- stream, a row write each; the slower claims were, the more of them.)
CREATE OR REPLACE FUNCTION {{schema}}outbox_clock() RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE AS
$$ BEGIN RETURN clock_timestamp() + coalesce((SELECT clock_shift FROM {{schema}}outbox_control), interval '0'); END $$;

CREATE TABLE IF NOT EXISTS {{schema}}outbox_events (
    sequence          BIGINT PRIMARY KEY DEFAULT nextval('{{schema}}outbox_events_seq'),
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
    created_at        TIMESTAMPTZ NOT NULL DEFAULT {{schema}}outbox_now(),
    available_at      TIMESTAMPTZ NOT NULL DEFAULT {{schema}}outbox_now(),
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
ALTER TABLE {{schema}}outbox_events ADD COLUMN IF NOT EXISTS suspect_span INTEGER NOT NULL DEFAULT 0;

-- Ticks find new rows by transaction.
CREATE INDEX IF NOT EXISTS outbox_events_txid
    ON {{schema}}outbox_events (txid);
-- Rows outside the stream, per key in claim order: the claim visits each
-- key's first such row (a loose index scan), never the backlog behind it.
CREATE INDEX IF NOT EXISTS outbox_events_tracked
    ON {{schema}}outbox_events (partition_key, position) WHERE status IN (4, 5) OR blocks_key;
-- The rows that can head a key's wait, per key in claim order: tracked
-- rows and blocking rows, not the rows parked behind a blocking row (always
-- after it, and none can go before it does). The general pick walks these:
-- with the parked rows, each claim read up to a batch of them per blocked
-- key (100 keys with 300 parked each: 66 ms a claim, against 2.5).
CREATE INDEX IF NOT EXISTS outbox_events_heads
    ON {{schema}}outbox_events (partition_key, position) WHERE status = 4 OR blocks_key;
-- Tracked rows by the time they are due: the keys a claim visits for its
-- tracked rows are those with one due now. A key whose tracked rows are
-- all for later (delayed events, retries backing off) or behind a blocking
-- row has nothing that can go; visiting every such key cost each claim
-- about 12 µs a key (10,000 delayed events on their own keys: 120 ms).
CREATE INDEX IF NOT EXISTS outbox_events_due
    ON {{schema}}outbox_events (available_at, partition_key) WHERE status = 4;
-- Rows blamed for crashes: the crash-loop sweep reads only these.
CREATE INDEX IF NOT EXISTS outbox_events_unfinished
    ON {{schema}}outbox_events (unfinished_claims) WHERE status = 4 AND unfinished_claims > 0;
CREATE INDEX IF NOT EXISTS outbox_events_published
    ON {{schema}}outbox_events (published_at) WHERE status = 2;
CREATE INDEX IF NOT EXISTS outbox_events_failed
    ON {{schema}}outbox_events (sequence) WHERE status = 3;
-- Failed rows of one type, of one key: an operator's filtered pages find a
-- rare type or key without stepping over every other failed row.
CREATE INDEX IF NOT EXISTS outbox_events_failed_type
    ON {{schema}}outbox_events (event_type, sequence) WHERE status = 3;
CREATE INDEX IF NOT EXISTS outbox_events_failed_key
    ON {{schema}}outbox_events (partition_key, sequence) WHERE status = 3;

-- Claim order ("the stream"): each tick appends the rows whose transactions
-- it first sees committed, in sequence order, as runs of at most 64 (small
-- enough to stay in the heap page, unTOASTed). Position p is
-- sequences[p - first_position + 1]; its key and available_at ride along,
-- so a claim decides on the run alone and reads only the rows it picks.
CREATE TABLE IF NOT EXISTS {{schema}}outbox_order (
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
    ON {{schema}}outbox_order USING gist (int8range(lo_sequence, hi_sequence, '[]'));

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
CREATE TABLE IF NOT EXISTS {{schema}}outbox_lanes (
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
ALTER TABLE {{schema}}outbox_lanes
    ADD COLUMN IF NOT EXISTS ready_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity';
CREATE INDEX IF NOT EXISTS outbox_lanes_ready ON {{schema}}outbox_lanes (ready_at);
-- Sliced on every claim of the key: stored uncompressed.
ALTER TABLE {{schema}}outbox_lanes ALTER COLUMN sequences SET STORAGE EXTERNAL;
ALTER TABLE {{schema}}outbox_lanes ALTER COLUMN positions SET STORAGE EXTERNAL;
-- How many stream positions a claim reads (at least): larger while busy
-- keys' rows fill the windows (a burst being set aside), back to a batch
-- and a quarter after. A hint, kept in a sequence: setval writes no row
-- version (a transaction holding xmin keeps none) and is not undone by a
-- rollback (harmless for a hint).
CREATE SEQUENCE IF NOT EXISTS {{schema}}outbox_pass_window MINVALUE 1 START 1;

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
CREATE TABLE IF NOT EXISTS {{schema}}outbox_cursor_states (
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
CREATE OR REPLACE VIEW {{schema}}outbox_cursor_now AS
    SELECT * FROM {{schema}}outbox_cursor_states ORDER BY id DESC LIMIT 1;

-- The lease watermarks (see outbox_cursor_states).
CREATE OR REPLACE FUNCTION {{schema}}outbox_live_from() RETURNS bigint
    LANGUAGE plpgsql STABLE AS
$$ BEGIN RETURN coalesce((SELECT live_from FROM {{schema}}outbox_cursor_now), 0); END $$;
CREATE OR REPLACE FUNCTION {{schema}}outbox_kept_from() RETURNS bigint
    LANGUAGE plpgsql STABLE AS
$$ BEGIN RETURN coalesce((SELECT kept_from FROM {{schema}}outbox_cursor_now), 0); END $$;

-- Writes the cursor's new state (see outbox_cursor_states).
CREATE OR REPLACE FUNCTION {{schema}}outbox_cursor_write(
    p_position bigint, p_end_position bigint, p_tick_snapshot pg_snapshot,
    p_system_identifier bigint, p_moved_at timestamptz, p_rebased_at timestamptz,
    p_live_from bigint, p_kept_from bigint)
    RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO {{schema}}outbox_cursor_states
        (position, end_position, tick_snapshot, system_identifier, moved_at, rebased_at,
         live_from, kept_from)
    VALUES (p_position, p_end_position, p_tick_snapshot, p_system_identifier, p_moved_at,
            p_rebased_at, p_live_from, p_kept_from)
    RETURNING id INTO v_id;
    -- Older states have no use (a reader's snapshot still sees the ones it
    -- needs): delete them in batches, by key range.
    IF v_id % 256 = 0 THEN
        DELETE FROM {{schema}}outbox_cursor_states WHERE id < v_id - 64;
    END IF;
END
$$;

-- Where the cursor was when, at most one entry per second (inserted, never
-- updated: see outbox_cursor_states): when a stream row was published (to
-- the second), and what purge may delete.
CREATE TABLE IF NOT EXISTS {{schema}}outbox_cursor_log (
    position BIGINT PRIMARY KEY,
    at       TIMESTAMPTZ NOT NULL
);

-- A relay's claim. `held` (with `held_positions`) are the rows still in
-- flight, fenced by the token; `positions` every stream position the claim
-- took, kept until the cursor has passed them all (an acked stream row needs
-- no write of its own). `keys` are the partition keys still in flight: a key
-- with a row in flight waits whole.
CREATE TABLE IF NOT EXISTS {{schema}}outbox_leases (
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
ALTER TABLE {{schema}}outbox_leases ALTER COLUMN held SET STORAGE EXTERNAL;
ALTER TABLE {{schema}}outbox_leases ALTER COLUMN held_positions SET STORAGE EXTERNAL;
ALTER TABLE {{schema}}outbox_leases ALTER COLUMN positions SET STORAGE EXTERNAL;
ALTER TABLE {{schema}}outbox_leases ALTER COLUMN keys SET STORAGE EXTERNAL;
-- Leases come and go with every batch, and an open transaction anywhere on
-- the server keeps their dead versions: claims reach the live ones (and
-- those the cursor has not passed) by index from the watermark, never by
-- reading the heap. (An index of the live leases by expiry held every
-- emptied lease's dead entry below the time of day, and reaping read them
-- all while xmin was held.)
DROP INDEX IF EXISTS {{schema}}outbox_leases_live;
CREATE INDEX IF NOT EXISTS outbox_leases_held
    ON {{schema}}outbox_leases (token) WHERE cardinality(held) > 0;
CREATE INDEX IF NOT EXISTS outbox_leases_max_position
    ON {{schema}}outbox_leases (max_position);

CREATE TABLE IF NOT EXISTS {{schema}}outbox_attempts (
    id          BIGSERIAL PRIMARY KEY,
    event_id    UUID NOT NULL,
    kind        TEXT NOT NULL,
    at          TIMESTAMPTZ NOT NULL,
    actor       TEXT NOT NULL,
    error_class TEXT,
    detail      TEXT NOT NULL,
    attempts    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_attempts_event ON {{schema}}outbox_attempts (event_id, id);

CREATE TABLE IF NOT EXISTS {{schema}}outbox_inbox (
    consumer   TEXT NOT NULL,
    event_id   UUID NOT NULL,
    claimed_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS outbox_inbox_claimed_at ON {{schema}}outbox_inbox (claimed_at);

CREATE TABLE IF NOT EXISTS {{schema}}outbox_relays (
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
ALTER TABLE {{schema}}outbox_relays ADD COLUMN IF NOT EXISTS outage_since TIMESTAMPTZ;
ALTER TABLE {{schema}}outbox_relays ADD COLUMN IF NOT EXISTS outage_destination TEXT;
ALTER TABLE {{schema}}outbox_relays ADD COLUMN IF NOT EXISTS outage_reason TEXT;

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
CREATE OR REPLACE FUNCTION {{schema}}outbox_events_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({{producer_lock}});
    IF pg_sequence_last_value('{{schema}}outbox_relay_waiting') = 1
       AND current_setting('outbox.notify', true) IS DISTINCT FROM 'off' THEN
        PERFORM pg_notify('{{channel}}', '');
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_events_notify ON {{schema}}outbox_events;
CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON {{schema}}outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}outbox_events_notify();

