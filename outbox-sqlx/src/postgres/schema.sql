-- outbox schema for PostgreSQL (>= 13: xid8). Rendered with the configured
-- names; the file in migrations/postgres/ is this template with the defaults.

CREATE SEQUENCE IF NOT EXISTS {{schema}}outbox_events_seq;

CREATE TABLE IF NOT EXISTS {{schema}}outbox_events (
    sequence          BIGINT PRIMARY KEY,
    -- Claim order is (order_xid, ord). Rows of transactions older than the
    -- oldest running one (pg_snapshot_xmin) are final, so a late committer
    -- is never overtaken. A superseding event copies both from the event it
    -- replaces, taking its place.
    order_xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    ord               BIGINT NOT NULL,
    event_id          UUID NOT NULL,
    aggregate_type    TEXT NOT NULL,
    aggregate_id      TEXT NOT NULL,
    event_type        TEXT NOT NULL,
    partition_key     TEXT NOT NULL,
    payload           JSONB NOT NULL,
    payload_version   INTEGER NOT NULL,
    headers           JSONB NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL,
    available_at      TIMESTAMPTZ NOT NULL,
    -- 0 pending in claim order: published once the cursor has passed it;
    -- 2 published out of cursor order; 3 failed; 4 pending and tracked
    -- (delayed, retrying, requeued or a replacement: found by its own index
    -- wherever the cursor is). A row leased by a relay is in outbox_leases.
    -- The happy path never updates a row: publication moves the cursor.
    status            SMALLINT NOT NULL DEFAULT 0,
    blocks_key        BOOLEAN NOT NULL DEFAULT FALSE,
    superseded_by     UUID,
    attempts          INTEGER NOT NULL DEFAULT 0,
    unfinished_claims INTEGER NOT NULL DEFAULT 0,
    published_at      TIMESTAMPTZ,
    CONSTRAINT outbox_events_event_id_key UNIQUE (event_id)
);

-- Claim order: the claim reads forward from the cursor, never the history.
CREATE INDEX IF NOT EXISTS outbox_events_order
    ON {{schema}}outbox_events (order_xid, ord);
-- Tracked rows (status 4) and failed rows that block their key: the claim
-- and the per-key check find them wherever the cursor is.
CREATE INDEX IF NOT EXISTS outbox_events_tracked
    ON {{schema}}outbox_events (partition_key, order_xid, ord) WHERE status = 4 OR blocks_key;
CREATE INDEX IF NOT EXISTS outbox_events_tracked_due
    ON {{schema}}outbox_events (order_xid, ord) WHERE status = 4;
-- Rows claimed without an outcome yet: the crash-loop sweep reads only these.
CREATE INDEX IF NOT EXISTS outbox_events_unfinished
    ON {{schema}}outbox_events (unfinished_claims) WHERE status IN (0, 4) AND unfinished_claims > 0;
CREATE INDEX IF NOT EXISTS outbox_events_published
    ON {{schema}}outbox_events (published_at) WHERE status = 2;
CREATE INDEX IF NOT EXISTS outbox_events_failed
    ON {{schema}}outbox_events (sequence) WHERE status = 3;

-- Every status-0 row before (order_xid, ord) is published. Acks move it
-- past the rows they settle; it never passes a row a relay still holds, a
-- pending one, or a transaction still running (pg_snapshot_xmin).
CREATE TABLE IF NOT EXISTS {{schema}}outbox_cursor (
    id        BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    order_xid xid8 NOT NULL,
    ord       BIGINT NOT NULL,
    moved_at  TIMESTAMPTZ NOT NULL,
    -- A relay is waiting for a NOTIFY (set by PgWakeUp, cleared by a claim).
    relay_waiting BOOLEAN NOT NULL DEFAULT FALSE
);
INSERT INTO {{schema}}outbox_cursor (id, order_xid, ord, moved_at)
    VALUES (TRUE, '0', 0, now()) ON CONFLICT (id) DO NOTHING;
-- Where the cursor was when, at most one entry per second: when a row it
-- passed was published (to the second), and what purge may delete.
CREATE TABLE IF NOT EXISTS {{schema}}outbox_cursor_log (
    order_xid xid8 NOT NULL,
    ord       BIGINT NOT NULL,
    at        TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (order_xid, ord)
);

-- A relay's claim: the rows it holds, fenced by the token. Settlements
-- remove their rows; the claim after expiry deletes the lease (counting an
-- unfinished claim on each row still in it).
CREATE TABLE IF NOT EXISTS {{schema}}outbox_leases (
    token      BIGSERIAL PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    sequences  BIGINT[] NOT NULL,
    -- The partition keys of its rows: a key with a leased row waits.
    keys       TEXT[] NOT NULL
);
-- A lease lives for one batch: compressing its arrays costs more than it saves.
ALTER TABLE {{schema}}outbox_leases ALTER COLUMN sequences SET STORAGE EXTERNAL;
ALTER TABLE {{schema}}outbox_leases ALTER COLUMN keys SET STORAGE EXTERNAL;

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
    last_seen TIMESTAMPTZ NOT NULL
);

-- Wake idle relays on commit (a hint: polling stays the backstop), only
-- while a relay waits: a NOTIFY costs every committing transaction a
-- cluster-wide lock and about 0.1 ms, which a busy relay does not need. The
-- shared lock pairs with the exclusive one a relay takes to set
-- relay_waiting, so either the relay's next look sees this transaction's
-- rows or this trigger (a fresh snapshot per statement) sees the flag.
CREATE OR REPLACE FUNCTION {{schema}}outbox_events_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('{{schema}}outbox_events_wake'), 0);
    IF (SELECT relay_waiting FROM {{schema}}outbox_cursor) THEN
        PERFORM pg_notify('outbox_events', '');
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_events_notify ON {{schema}}outbox_events;
CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON {{schema}}outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}outbox_events_notify();
