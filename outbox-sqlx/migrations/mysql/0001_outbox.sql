-- outbox schema for MySQL 8 / MariaDB >= 10.6 (SKIP LOCKED, JSON_TABLE).
-- Times are microseconds since the Unix epoch (UTC). Rendered with the
-- configured names; migrations/mysql/ holds it with the defaults.

-- Which version of this schema the tables are (migrate() refuses tables of
-- another version with an error naming the upgrade notes).
CREATE TABLE IF NOT EXISTS outbox_schema_version (version INTEGER NOT NULL) ENGINE = InnoDB;
INSERT INTO outbox_schema_version (version)
    SELECT 2 FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM outbox_schema_version);

CREATE TABLE IF NOT EXISTS outbox_events (
    sequence          BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id          CHAR(36) NOT NULL,
    aggregate_type    VARCHAR(255) NOT NULL,
    aggregate_id      VARCHAR(255) NOT NULL,
    event_type        VARCHAR(255) NOT NULL,
    partition_key     VARCHAR(255) NOT NULL,
    payload           LONGTEXT NOT NULL,
    payload_version   INT NOT NULL,
    headers           TEXT NOT NULL,
    created_at        BIGINT NOT NULL,
    available_at      BIGINT NOT NULL,
    -- 0 pending, 1 in flight, 2 published, 3 failed; pending but set aside
    -- by the claim that met it, so no later claim steps over it: 4 parked
    -- behind a failed row that blocks its key (set back when the block is
    -- lifted), 5 waiting behind a row of its key not yet due (set back by
    -- the claim that finds that row due)
    status            TINYINT NOT NULL DEFAULT 0,
    blocks_key        BOOLEAN NOT NULL DEFAULT FALSE,
    -- A failed event superseded under Block keeps blocking its key for
    -- everything but its replacement, until the replacement is published.
    superseded_by     CHAR(36) NULL,
    attempts          INT NOT NULL DEFAULT 0,
    -- Crashes blamed on this row alone, and whether it shared a lease that
    -- ended without an outcome; then, until it settles, a lease carries at
    -- most `suspect_span` suspects with it (outbox_core::store::judge_crash).
    unfinished_claims INT NOT NULL DEFAULT 0,
    suspect           BOOLEAN NOT NULL DEFAULT FALSE,
    suspect_span      INT NOT NULL DEFAULT 0,
    fencing_token     BIGINT NOT NULL DEFAULT 0,
    -- The claim that leased it: rows of one lease share a crash. A lease
    -- claimed while an older one of its owner was in flight (a prefetch)
    -- is marked unstarted once that one expires: it goes back unblamed.
    lease_id          BIGINT NOT NULL DEFAULT 0,
    lease_unstarted   BOOLEAN NOT NULL DEFAULT FALSE,
    -- Set by the enqueue that wrote the row, so a concurrent enqueue of the
    -- same id can tell its own insert from the other's.
    enqueue_mark      BIGINT NOT NULL DEFAULT 0,
    -- Set by releases before the lease owners table; a lease's owner is
    -- now in outbox_lease_owners.
    lease_owner       VARCHAR(255) NULL,
    -- 0 until first leased, so a lease rewrites the row in place.
    lease_expires_at  BIGINT NULL DEFAULT 0,
    -- -1 until published (NULL in rows of earlier releases), so an ack
    -- rewrites the row in place.
    published_at      BIGINT NULL DEFAULT -1,
    UNIQUE KEY outbox_events_event_id (event_id),
    -- No partial indexes here: status leads, so the claim reads the live
    -- ranges (0, 1) and never the published rows. Every lease and every
    -- ack rewrites the entries of each index that holds status, so only
    -- the one that must hold it does. It holds `available_at` too: a
    -- claim tells a row not yet due (a head backing off, a delay) on the
    -- index entry, without reading the row (10,000 heads backing off cost
    -- every claim a fifth of its time in row reads). A retry or a
    -- requeue, the writes of `available_at`, change the status anyway.
    -- migrate() brings tables made by earlier releases to these
    -- definitions.
    KEY outbox_events_live (status, sequence, available_at),
    -- A key's failed rows that block it, for the claim's per-key check
    -- (only a failure under Block sets blocks_key, and leases and acks
    -- never change it). The claim reads the keys in flight once, with its
    -- reaping, rather than per candidate.
    KEY outbox_events_key (partition_key, blocks_key, sequence),
    -- A key's rows not due yet (delayed, backing off): the claim's per-key
    -- check finds them without reading the key's due backlog. Only pending
    -- rows are ever ahead of now, so status is checked on the row.
    KEY outbox_events_key_due (partition_key, available_at),
    -- The crash-loop sweep before every claim reads only rows claimed
    -- without an outcome (every settlement sets the count back to 0).
    KEY outbox_events_unfinished (unfinished_claims),
    -- Only an ack sets published_at: purge reads published rows by age.
    KEY outbox_events_published (published_at),
    KEY outbox_events_superseded (superseded_by)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per partition key. Enqueue upserts the keys it writes, holding
-- their row locks until commit: writers of one key take turns, so a key's
-- insert order is its commit order.
CREATE TABLE IF NOT EXISTS outbox_keys (
    partition_key VARCHAR(255) NOT NULL PRIMARY KEY
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Keys with rows a claim set aside behind a row not yet due (status 5 in
-- outbox_events): a claim that finds a key's head due sets them back. Only
-- claims write it (producers never lock it), so a claim's read of it waits
-- for no business transaction.
CREATE TABLE IF NOT EXISTS outbox_waiting_keys (
    partition_key VARCHAR(255) NOT NULL PRIMARY KEY
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Store time is the database clock, shifted only by tests.
CREATE TABLE IF NOT EXISTS outbox_clock (
    id             INT NOT NULL PRIMARY KEY,
    clock_shift_us BIGINT NOT NULL DEFAULT 0
) ENGINE = InnoDB;
INSERT IGNORE INTO outbox_clock (id) VALUES (1);

-- Claims on one table take turns on this row. It also keeps where the
-- reaping read of the rows in flight starts (`flight_from`): no row in
-- flight has a smaller sequence (only claims lease rows, and each moves
-- it to the first row still in flight, or below its own leases). While
-- any session holds a read view, InnoDB keeps every entry an ack
-- delete-marks in the live index, and a read from the start of the
-- in-flight range would step over all of them on every claim.
CREATE TABLE IF NOT EXISTS outbox_claim_lock (
    id INT NOT NULL PRIMARY KEY,
    flight_from BIGINT NOT NULL DEFAULT 0
) ENGINE = InnoDB;
INSERT IGNORE INTO outbox_claim_lock (id) VALUES (1);

-- Who holds each lease, one row per claim rather than a name written into
-- each leased row: a row whose columns keep their size is rewritten in
-- place, while a name written into a NULL column grew every leased row
-- (InnoDB moved it within its page or split the page: about half of a
-- lease's time; the same for an ack that wrote a NULL `published_at`).
-- Claims add a row and now and then remove the rows of leases with
-- nothing left in flight.
CREATE TABLE IF NOT EXISTS outbox_lease_owners (
    lease_id   BIGINT NOT NULL PRIMARY KEY,
    owner      VARCHAR(255) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS outbox_attempts (
    id          BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id    CHAR(36) NOT NULL,
    kind        VARCHAR(32) NOT NULL,
    at          BIGINT NOT NULL,
    actor       VARCHAR(255) NOT NULL,
    error_class VARCHAR(16) NULL,
    detail      TEXT NOT NULL,
    attempts    INT NOT NULL,
    KEY outbox_attempts_event (event_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS outbox_inbox (
    consumer   VARCHAR(255) NOT NULL,
    event_id   CHAR(36) NOT NULL,
    claimed_at BIGINT NOT NULL,
    PRIMARY KEY (consumer, event_id),
    KEY outbox_inbox_claimed_at (claimed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS outbox_relays (
    relay         VARCHAR(255) NOT NULL PRIMARY KEY,
    last_seen     BIGINT NOT NULL,
    -- The relay host's clock minus the database's, for operators only.
    clock_skew_ms BIGINT NOT NULL DEFAULT 0,
    -- Set while the relay is paused because its publisher reports an
    -- outage (store time in microseconds, where, the latest error).
    outage_since       BIGINT NULL,
    outage_destination VARCHAR(255) NULL,
    outage_reason      TEXT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
