//! Hooks for the core's conformance suites (feature `testing`): the fault
//! seams are MySQL's protocol's, written once in `outbox-sql`.

use super::store::MySqlStore;

outbox_sql::sql_fault_seams!(MySqlStore, protocol);
