-- Drops what up.sql created in the current database.
DROP TABLE IF EXISTS outbox_events, outbox_keys, outbox_clock, outbox_claim_lock,
    outbox_attempts, outbox_inbox, outbox_relays, outbox_schema_version;
