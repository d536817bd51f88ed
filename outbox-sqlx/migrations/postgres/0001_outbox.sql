-- outbox schema for PostgreSQL (>= 13: xid8). Rendered with the configured
-- names; the file in migrations/postgres/ is this template with the defaults.

CREATE SEQUENCE IF NOT EXISTS outbox_events_seq;

CREATE TABLE IF NOT EXISTS outbox_events (
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
    -- 0 pending, 1 in flight, 2 published, 3 failed
    status            SMALLINT NOT NULL DEFAULT 0,
    blocks_key        BOOLEAN NOT NULL DEFAULT FALSE,
    superseded_by     UUID,
    attempts          INTEGER NOT NULL DEFAULT 0,
    unfinished_claims INTEGER NOT NULL DEFAULT 0,
    fencing_token     BIGINT NOT NULL DEFAULT 0,
    lease_owner       TEXT,
    lease_expires_at  TIMESTAMPTZ,
    published_at      TIMESTAMPTZ,
    CONSTRAINT outbox_events_event_id_key UNIQUE (event_id)
);

-- The live backlog in claim order: the claim never reads published rows.
CREATE INDEX IF NOT EXISTS outbox_events_live
    ON outbox_events (order_xid, ord) WHERE status IN (0, 1);
-- A key's unsettled rows, for the per-key ordering check.
CREATE INDEX IF NOT EXISTS outbox_events_key_live
    ON outbox_events (partition_key, order_xid, ord) WHERE status IN (0, 1) OR blocks_key;
-- Rows claimed without an outcome yet: the crash-loop sweep reads only these.
CREATE INDEX IF NOT EXISTS outbox_events_unfinished
    ON outbox_events (unfinished_claims) WHERE status IN (0, 1) AND unfinished_claims > 0;
CREATE INDEX IF NOT EXISTS outbox_events_published
    ON outbox_events (published_at) WHERE status = 2;
CREATE INDEX IF NOT EXISTS outbox_events_failed
    ON outbox_events (sequence) WHERE status = 3;

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
    last_seen TIMESTAMPTZ NOT NULL
);

-- Wake idle relays on commit (a hint: polling stays the backstop). One
-- notification per statement, and PostgreSQL folds duplicates per transaction.
CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_events', '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_events_notify ON outbox_events;
CREATE TRIGGER outbox_events_notify
    AFTER INSERT ON outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_events_notify();
