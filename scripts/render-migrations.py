#!/usr/bin/env python3
"""Renders migrations/{postgres,mysql,sqlite}/0001_outbox.sql from the schema templates with
the default names and limits, exactly as PgStore::schema_sql() does (a test,
shipped_migration_is_the_default_rendering, keeps the two identical)."""
import pathlib

workspace = pathlib.Path(__file__).resolve().parent.parent
root = workspace / "outbox-sqlx"
templates = workspace / "outbox-sql/src"


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) % (1 << 64)
    return h


def lock_key(name: str) -> int:
    h = fnv1a(name.encode())
    return h - (1 << 64) if h >= (1 << 63) else h


template = (templates / "postgres/schema.sql").read_text()
producer_lock = lock_key("outbox_events") ^ 0x0B5E55ED
producer_bits = producer_lock % (1 << 64)
rendered = (
    template.replace("{{schema}}", "")
    .replace("{{channel}}", "outbox_events")
    .replace("{{claim_lock}}", str(lock_key("outbox_events")))
    .replace("{{producer_lock}}", str(producer_lock))
    .replace("{{producer_lock_classid}}", str(producer_bits >> 32))
    .replace("{{producer_lock_objid}}", str(producer_bits & 0xFFFFFFFF))
    .replace("{{schema_version}}", "2")
    .replace("{{max_identifier_bytes}}", "255")
    .replace("{{max_payload_bytes}}", "262144")
    .replace("{{max_header_bytes}}", "16384")
)
# The fingerprint of the text before it is filled in (outbox_sql::postgres::schema_fingerprint).
rendered = rendered.replace("{{fingerprint}}", f"{fnv1a(rendered.encode()):016x}")
(root / "migrations/postgres/0001_outbox.sql").write_text(rendered)
# Diesel's PostgreSQL migration is the same rendering.
(workspace / "outbox-diesel/migrations/2026-12-01-000000_outbox/up.sql").write_text(rendered)

# MySQL and SQLite: the template with the default (unqualified) names.
for dialect in ("mysql", "sqlite"):
    template = (templates / f"{dialect}/schema.sql").read_text()
    (root / f"migrations/{dialect}/0001_outbox.sql").write_text(template.replace("{{schema}}", ""))
    if dialect == "mysql":
        # Diesel's MySQL migration is the same rendering.
        diesel = workspace / "outbox-diesel/migrations-mysql/2026-12-01-000000_outbox/up.sql"
        diesel.write_text(template.replace("{{schema}}", ""))
