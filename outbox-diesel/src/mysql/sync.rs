//! The outbox on a synchronous Diesel connection to MySQL/MariaDB: enqueue
//! and migrate in your transaction, and the inbox's claim and `apply_once`
//! for consumers that write their effects synchronously. The protocol is
//! the async API's, run over the blocking connection.
//!
//! Any [`LoadConnection`] with the `Mysql` backend serves: Diesel's own
//! `MysqlConnection` (Diesel's `mysql` feature, or this crate's
//! `mysql-sync`; it links the MariaDB/MySQL client library), an r2d2
//! pooled one, or diesel-async's `AsyncConnectionWrapper<AsyncMysqlConnection>`
//! (pure Rust; call it from a thread outside the async runtime).
//!
//! This module uses only `diesel::RunQueryDsl`; the async modules use only
//! `diesel_async::RunQueryDsl`, so no call sees both traits (E0034).

use async_trait::async_trait;
use diesel::RunQueryDsl;
use diesel::connection::LoadConnection;
use diesel::mysql::Mysql;
use outbox_core::store::EnqueueOutcome;
use outbox_core::{EventId, NewEvent, StoreError};
use outbox_sql::Migrated;
use outbox_sql::mysql::{Exec, Param, Row};

use super::MysqlOutbox;
use super::driver::{AnyRow, bind, rows, unique};
use crate::error::ResultExt;

/// The caller's synchronous connection. Its statements block and never
/// wait on anything else, so the protocol's future over it is ready at its
/// first poll ([`run_sync`]).
struct Blocking<'c, C>(&'c mut C);

#[async_trait]
impl<C: LoadConnection<Backend = Mysql> + Send> Exec for Blocking<'_, C> {
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError> {
        let changed = bind(sql, params).execute(self.0).store()?;
        Ok(changed as u64)
    }

    async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError> {
        bind(sql, params).load::<AnyRow>(self.0).store().map(rows)
    }

    async fn insert_unique(&mut self, sql: &str, params: Vec<Param>) -> Result<bool, StoreError> {
        unique(bind(sql, params).execute(self.0))
    }
}

/// Runs the protocol's `work` over a [`Blocking`] connection to its end.
/// Every await inside is a blocking statement that has already finished,
/// so one poll with a waker that does nothing completes it; no runtime is
/// needed.
fn run_sync<T>(work: impl std::future::Future<Output = T>) -> T {
    use std::task::{Context, Poll, Waker};
    let mut work = std::pin::pin!(work);
    match work.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => unreachable!("a blocking connection's work completes at its first poll"),
    }
}

impl MysqlOutbox {
    /// [`MysqlOutbox::enqueue`] on a synchronous connection
    /// (`MysqlConnection`, …), inside `conn.transaction(|conn| …)`.
    pub fn enqueue_sync(
        &self,
        conn: &mut (impl LoadConnection<Backend = Mysql> + Send),
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        run_sync(self.statements.enqueue(&mut Blocking(conn), events))
    }

    /// [`MysqlOutbox::migrate`] on a synchronous connection.
    pub fn migrate_sync(
        &self,
        conn: &mut (impl LoadConnection<Backend = Mysql> + Send),
    ) -> Result<Migrated, StoreError> {
        run_sync(self.statements.migrate_on(&mut Blocking(conn)))
    }

    /// Claims `(consumer, event_id)` in the inbox on `conn`, inside your
    /// transaction: `true` means "apply the effect now", `false` that this
    /// consumer already applied the event (a redelivery). A duplicate is a
    /// plain insert failing on the primary key: MySQL undoes just that
    /// statement, and your transaction goes on.
    pub fn claim_sync(
        &self,
        conn: &mut (impl LoadConnection<Backend = Mysql> + Send),
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        run_sync(
            self.statements
                .inbox_claim(&mut Blocking(conn), consumer, event_id),
        )
        .map_err(|e| e.during("inbox claim", self.config().tables.inbox()))
    }

    /// Applies `effect` once for `consumer` on a synchronous connection:
    /// in one Diesel transaction the inbox claim is written and, if it is
    /// new, `effect` runs on the same connection; both commit or neither
    /// does. `Ok(None)` is a redelivery (nothing ran); an error from
    /// `effect` rolls the claim back, so a later delivery tries again.
    pub fn apply_once_sync<C, R, E, F>(
        &self,
        conn: &mut C,
        consumer: &str,
        event_id: EventId,
        effect: F,
    ) -> Result<Option<R>, E>
    where
        C: LoadConnection<Backend = Mysql> + Send,
        F: FnOnce(&mut C) -> Result<R, E>,
        E: From<diesel::result::Error> + From<StoreError>,
    {
        run_sync(self.statements.sync_clock_on(&mut Blocking(conn)))?;
        crate::effect::claim_then_apply(
            conn,
            |conn| self.claim_sync(conn, consumer, event_id),
            effect,
        )
    }
}
