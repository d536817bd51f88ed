//! Hooks for the core's commit-order and failure suites (feature
//! `testing`): the fault seams are MySQL's protocol's, written once in
//! `outbox-sql`.

use super::store::MysqlStore;

outbox_sql::sql_fault_seams!(MysqlStore, protocol);
