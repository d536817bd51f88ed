-- outbox schema for SQLite (>= 3.35: RETURNING, UPDATE FROM). Times are
-- microseconds since the Unix epoch (UTC). Rendered with the configured
-- prefix; the file in migrations/sqlite/ is this template with the defaults.

-- Which version of this schema the tables are (migrate() refuses tables of
-- another version with an error naming the upgrade notes).
CREATE TABLE IF NOT EXISTS outbox_schema_version (version INTEGER NOT NULL);
INSERT INTO outbox_schema_version (version)
    SELECT 2 WHERE NOT EXISTS (SELECT 1 FROM outbox_schema_version);

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
    -- 0 pending, 1 in flight, 2 published, 3 failed; pending but set aside
    -- by the claim that met it, so no later claim steps over it: 4 parked
    -- behind a failed row that blocks its key (set back when the block is
    -- lifted), 5 waiting behind a row of its key not yet due (set back by
    -- the claim that finds that row due)
    status            INTEGER NOT NULL DEFAULT 0,
    blocks_key        INTEGER NOT NULL DEFAULT 0,
    superseded_by     TEXT,
    attempts          INTEGER NOT NULL DEFAULT 0,
    -- Crashes blamed on this row alone, and whether it shared a lease that
    -- ended without an outcome; then, until it settles, a lease carries at
    -- most `suspect_span` suspects with it (outbox_core::store::judge_crash).
    unfinished_claims INTEGER NOT NULL DEFAULT 0,
    suspect           INTEGER NOT NULL DEFAULT 0,
    suspect_span      INTEGER NOT NULL DEFAULT 0,
    fencing_token     INTEGER NOT NULL DEFAULT 0,
    -- The claim that leased it: rows of one lease share a crash. A lease
    -- claimed while an older one of its owner was in flight (a prefetch)
    -- is marked unstarted once that one expires: it goes back unblamed.
    lease_id          INTEGER NOT NULL DEFAULT 0,
    lease_unstarted   INTEGER NOT NULL DEFAULT 0,
    lease_owner       TEXT,
    lease_expires_at  INTEGER,
    published_at      INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_events_live
    ON outbox_events (COALESCE(ord, sequence), sequence) WHERE status IN (0, 1);
CREATE INDEX IF NOT EXISTS outbox_events_key_live
    ON outbox_events (partition_key, COALESCE(ord, sequence), sequence) WHERE status IN (0, 1) OR blocks_key;
-- The claim's per-key check: a key's rows in flight, pending (by due
-- time, so rows not due yet are a short range) and blocking.
CREATE INDEX IF NOT EXISTS outbox_events_key_in_flight
    ON outbox_events (partition_key) WHERE status = 1;
CREATE INDEX IF NOT EXISTS outbox_events_key_due
    ON outbox_events (partition_key, available_at) WHERE status = 0;
CREATE INDEX IF NOT EXISTS outbox_events_key_blocking
    ON outbox_events (partition_key) WHERE blocks_key;
-- A key's parked rows: set back by the operator action that lifts its block.
CREATE INDEX IF NOT EXISTS outbox_events_key_parked
    ON outbox_events (partition_key) WHERE status = 4;
-- A key's waiting rows: set back by the lease of a row of the key.
CREATE INDEX IF NOT EXISTS outbox_events_key_waiting
    ON outbox_events (partition_key) WHERE status = 5;
-- Rows blamed for crashes: the crash-loop sweep reads only these.
CREATE INDEX IF NOT EXISTS outbox_events_unfinished
    ON outbox_events (unfinished_claims) WHERE status = 0 AND unfinished_claims > 0;
-- Leases in flight: the claim reaps expired ones first.
CREATE INDEX IF NOT EXISTS outbox_events_in_flight
    ON outbox_events (lease_expires_at) WHERE status = 1;

-- Store time is the clock of the host the database file is on (SQLite runs
-- in the relay's process), shifted only by tests.
CREATE TABLE IF NOT EXISTS outbox_control (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    clock_shift_us INTEGER NOT NULL DEFAULT 0
);
INSERT OR IGNORE INTO outbox_control (id) VALUES (1);
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
    relay         TEXT PRIMARY KEY,
    last_seen     INTEGER NOT NULL,
    -- The relay's configured clock minus store time, for operators only.
    clock_skew_ms INTEGER NOT NULL DEFAULT 0,
    -- Set while the relay is paused because its publisher reports an
    -- outage (store time, where, the latest error).
    outage_since       INTEGER,
    outage_destination TEXT,
    outage_reason      TEXT
);
