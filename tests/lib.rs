//! Tests that span adapters (no library code): an event enqueued through
//! Diesel and published by the sqlx store's relay (and the other way
//! round, on MariaDB), inbox claims shared by
//! both ORMs, and the catalog Diesel's migration builds against the one
//! the sqlx store's `migrate` builds. Each adapter's own tests stay in its
//! crate; adapters never depend on each other, this crate depends on them
//! all. PostgreSQL and MariaDB both.
