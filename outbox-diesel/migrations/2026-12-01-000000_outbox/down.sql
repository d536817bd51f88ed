-- Drops what up.sql created in the current schema: the tables (with the
-- trigger), the sequence and every outbox_* function.
DROP TABLE IF EXISTS outbox_events, outbox_attempts, outbox_inbox, outbox_relays, outbox_control,
    outbox_cursor, outbox_cursor_states, outbox_cursor_log, outbox_leases, outbox_order,
    outbox_lanes, outbox_schema_version, outbox_schema_applied CASCADE;
DROP SEQUENCE IF EXISTS outbox_events_seq, outbox_pass_window;
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'outbox\_%'
    LOOP
        EXECUTE 'DROP FUNCTION ' || f || ' CASCADE';
    END LOOP;
END
$$;
