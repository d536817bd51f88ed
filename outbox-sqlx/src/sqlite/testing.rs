//! Hooks for the core's conformance suites (feature `testing`): the fault
//! seams are SQLite's protocol's, written once in `outbox-sql`.

use super::store::SqliteStore;

outbox_sql::sql_fault_seams!(SqliteStore, protocol);
