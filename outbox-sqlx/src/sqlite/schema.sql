-- outbox schema for SQLite (>= 3.35: RETURNING, UPDATE FROM). Times are
-- microseconds since the Unix epoch (UTC). Rendered with the configured
-- prefix; the file in migrations/sqlite/ is this template with the defaults.

CREATE TABLE IF NOT EXISTS outbox_events (
    sequence          INTEGER PRIMARY KEY AUTOINCREMENT,
    -- Claim order is (COALESCE(ord, sequence), sequence). SQLite has one
    -- writer at a time, so sequence order is commit order. A superseding
    -- event sets ord to the replaced event's place.
    ord               INTEGER,
    event_id          TEXT NOT NULL UNIQUE,
    aggregate_type    TEXT NOT NULL,
    aggregate_id      TEXT NOT NULL,
    event_type        TEXT NOT NULL,
    partition_key     TEXT NOT NULL,
    payload           TEXT NOT NULL,
    payload_version   INTEGER NOT NULL,
    headers           TEXT NOT NULL,
    created_at        INTEGER NOT NULL,
    available_at      INTEGER NOT NULL,
    -- 0 pending, 1 in flight, 2 published, 3 failed
    status            INTEGER NOT NULL DEFAULT 0,
    blocks_key        INTEGER NOT NULL DEFAULT 0,
    superseded_by     TEXT,
    attempts          INTEGER NOT NULL DEFAULT 0,
    unfinished_claims INTEGER NOT NULL DEFAULT 0,
    fencing_token     INTEGER NOT NULL DEFAULT 0,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    published_at      INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_events_live
    ON outbox_events (COALESCE(ord, sequence), sequence) WHERE status IN (0, 1);
CREATE INDEX IF NOT EXISTS outbox_events_key_live
    ON outbox_events (partition_key, COALESCE(ord, sequence), sequence) WHERE status IN (0, 1) OR blocks_key;
-- Rows claimed without an outcome yet: the crash-loop sweep reads only these.
CREATE INDEX IF NOT EXISTS outbox_events_unfinished
    ON outbox_events (unfinished_claims) WHERE status IN (0, 1) AND unfinished_claims > 0;
CREATE INDEX IF NOT EXISTS outbox_events_published
    ON outbox_events (published_at) WHERE status = 2;
CREATE INDEX IF NOT EXISTS outbox_events_failed
    ON outbox_events (sequence) WHERE status = 3;

CREATE TABLE IF NOT EXISTS outbox_attempts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    TEXT NOT NULL,
    kind        TEXT NOT NULL,
    at          INTEGER NOT NULL,
    actor       TEXT NOT NULL,
    error_class TEXT,
    detail      TEXT NOT NULL,
    attempts    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_attempts_event ON outbox_attempts (event_id, id);

CREATE TABLE IF NOT EXISTS outbox_inbox (
    consumer   TEXT NOT NULL,
    event_id   TEXT NOT NULL,
    claimed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS outbox_inbox_claimed_at ON outbox_inbox (claimed_at);

CREATE TABLE IF NOT EXISTS outbox_relays (
    relay     TEXT PRIMARY KEY,
    last_seen INTEGER NOT NULL
);
