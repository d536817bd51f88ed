//! The embedded migration is the schema template's default rendering (the
//! catalog it builds is compared with the sqlx store's in the workspace's
//! `tests` crate).

use outbox_diesel::StoreConfig;
use outbox_diesel::postgres::PgOutbox;

#[test]
fn the_embedded_migration_is_the_default_rendering() {
    let on_disk = include_str!("../migrations/2026-12-01-000000_outbox/up.sql");
    assert_eq!(
        on_disk,
        PgOutbox::new(StoreConfig::default()).schema_sql(),
        "regenerate migrations/2026-12-01-000000_outbox/up.sql from PgOutbox::schema_sql()"
    );
}

#[test]
fn the_embedded_mysql_migration_is_the_default_rendering() {
    let on_disk = include_str!("../migrations-mysql/2026-12-01-000000_outbox/up.sql");
    assert_eq!(
        on_disk,
        outbox_diesel::mysql::MysqlOutbox::new(StoreConfig::default()).schema_sql(),
        "regenerate migrations-mysql/2026-12-01-000000_outbox/up.sql from MysqlOutbox::schema_sql()"
    );
}
