//! Hooks for the core's commit-order and failure suites (feature
//! `testing`): the fault seams are PostgreSQL's protocol's, written once in
//! `outbox-sql`; another host's clock reaches the enqueue side too.

use super::PgOutbox;
use super::store::PgStore;

outbox_sql::sql_fault_seams!(PgStore, protocol, |handle| handle.outbox =
    PgOutbox::new(handle.config().clone()));
