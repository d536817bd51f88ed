//! The outbox on a synchronous Diesel connection to PostgreSQL: enqueue and
//! migrate in your transaction, and the inbox's claim and `apply_once` for
//! consumers that write their effects synchronously. The statements are the
//! async API's.
//!
//! Any [`LoadConnection`] with the `Pg` backend serves: Diesel's own
//! `PgConnection` (Diesel's `postgres` feature, or this crate's
//! `postgres-sync`; it links libpq), an r2d2 pooled one, or diesel-async's
//! `AsyncConnectionWrapper<AsyncPgConnection>` (pure Rust; call it from a
//! thread outside the async runtime, such as `spawn_blocking`). This crate
//! itself links no C library.
//!
//! This module uses only `diesel::RunQueryDsl`; the async modules use only
//! `diesel_async::RunQueryDsl`. Keeping the two apart is what spares every
//! `.execute` the ambiguity of both traits in scope (E0034).

use diesel::connection::LoadConnection;
use diesel::pg::Pg;
use diesel::sql_types::{BigInt, Text, Uuid as SqlUuid};
use diesel::{Connection, RunQueryDsl};
use outbox_core::store::EnqueueOutcome;
use outbox_core::{EventId, NewEvent, StoreError};
use outbox_sql::Migrated;
use outbox_sql::enqueue::{EnqueueColumns, outcomes};

use super::PgOutbox;
use super::statements::{self, Applied, AppliedTable, Inserted, Installed, InstalledVersion};
use crate::error::ResultExt;

impl PgOutbox {
    /// [`PgOutbox::enqueue`] on a synchronous connection (`PgConnection`,
    /// …), inside `conn.transaction(|conn| …)`.
    pub fn enqueue_sync(
        &self,
        conn: &mut impl LoadConnection<Backend = Pg>,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        // Bad input is refused here, before anything is sent.
        let columns = EnqueueColumns::checked(events, &self.statements.config, true)?;
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<Inserted> = statements::enqueue(&self.statements.queries, columns)
            .load(conn)
            .store()
            .map_err(|e| e.during("enqueue", self.statements.config.tables.events()))?;
        Ok(outcomes(events, rows.into_iter().map(Inserted::pair)))
    }

    /// [`PgOutbox::migrate`] on a synchronous connection (it sleeps the
    /// thread between attempts).
    pub fn migrate_sync(
        &self,
        conn: &mut impl LoadConnection<Backend = Pg>,
    ) -> Result<Migrated, StoreError> {
        use outbox_sql::postgres::{MIGRATE_ATTEMPTS, migrate_locks_unavailable, migrate_pause};
        for attempt in 1..=MIGRATE_ATTEMPTS {
            if let Some(migrated) = self.migrate_sync_once(conn)? {
                return Ok(migrated);
            }
            std::thread::sleep(migrate_pause(attempt));
        }
        Err(migrate_locks_unavailable().during("migrate", self.statements.config.tables.events()))
    }

    fn migrate_sync_once(
        &self,
        conn: &mut impl LoadConnection<Backend = Pg>,
    ) -> Result<Option<Migrated>, StoreError> {
        let schema = self.schema_sql();
        let fingerprint = outbox_sql::postgres::schema_fingerprint(
            &self.statements.config,
            &self.statements.queries,
        );
        let migrated = conn.transaction::<_, crate::Error, _>(|conn| {
            diesel::sql_query(self.statements.queries.migrate_lock.as_str()).execute(conn)?;
            let installed: Installed =
                diesel::sql_query(self.statements.queries.installed_tables.as_str())
                    .get_result(conn)?;
            let version = if installed.both() {
                diesel::sql_query(self.statements.queries.installed_version.as_str())
                    .get_result::<InstalledVersion>(conn)?
                    .version
            } else {
                None
            };
            let migrated = self.check(&installed, version)?;
            let present = diesel::sql_query(self.statements.queries.applied_table.as_str())
                .get_result::<AppliedTable>(conn)?
                .present;
            if present {
                let applied =
                    diesel::sql_query(self.statements.queries.applied_fingerprint.as_str())
                        .get_result::<Applied>(conn)?;
                if applied.fingerprint.as_deref() == Some(fingerprint.as_str()) {
                    return Ok(Some(migrated));
                }
            }
            diesel::sql_query(outbox_sql::postgres::migrate_lock_timeout()).execute(conn)?;
            conn.batch_execute(&schema)?;
            Ok(Some(migrated))
        });
        match migrated {
            Err(crate::Error::Diesel(e)) if super::is_lock_timeout(&e) => Ok(None),
            other => other.map_err(|e| {
                e.into_store_error()
                    .during("migrate", self.statements.config.tables.events())
            }),
        }
    }

    /// Claims `(consumer, event_id)` in the inbox on `conn`, inside your
    /// transaction: `true` means "apply the effect now", `false` that this
    /// consumer already applied the event (a redelivery). The claim and
    /// your effect commit together or not at all.
    pub fn claim_sync(
        &self,
        conn: &mut impl Connection<Backend = Pg>,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        let inserted = diesel::sql_query(self.statements.queries.inbox_claim.as_str())
            .bind::<Text, _>(consumer)
            .bind::<SqlUuid, _>(*event_id.as_uuid())
            .execute(conn)
            .store()
            .map_err(|e| e.during("inbox claim", self.statements.config.tables.inbox()))?;
        Ok(inserted == 1)
    }

    /// Applies `effect` once for `consumer` on a synchronous connection:
    /// in one Diesel transaction the inbox claim is written and, if it is
    /// new, `effect` runs on the same connection; both commit or neither
    /// does. `Ok(None)` is a redelivery (nothing ran); an error from
    /// `effect` rolls the claim back, so a later delivery tries again.
    /// Inside a transaction of yours it runs as a savepoint.
    ///
    /// ```no_run
    /// # fn book(outbox: &outbox_diesel::postgres::PgOutbox,
    /// #         conn: &mut impl diesel::Connection<Backend = diesel::pg::Pg>,
    /// #         event_id: outbox_core::EventId) -> Result<(), outbox_diesel::Error> {
    /// use diesel::RunQueryDsl;
    ///
    /// let booked = outbox.apply_once_sync(conn, "revenue", event_id, |conn| {
    ///     diesel::sql_query("INSERT INTO revenue (amount_cents) VALUES (1200)").execute(conn)?;
    ///     Ok::<_, outbox_diesel::Error>(())
    /// })?;
    /// if booked.is_none() {
    ///     println!("a redelivery: already booked");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn apply_once_sync<C, R, E, F>(
        &self,
        conn: &mut C,
        consumer: &str,
        event_id: EventId,
        effect: F,
    ) -> Result<Option<R>, E>
    where
        C: Connection<Backend = Pg>,
        F: FnOnce(&mut C) -> Result<R, E>,
        E: From<diesel::result::Error> + From<StoreError>,
    {
        self.sync_clock_sync(conn)?;
        crate::effect::claim_then_apply(
            conn,
            |conn| self.claim_sync(conn, consumer, event_id),
            effect,
        )
    }

    /// The store-time shift of a configured clock skew (tests), as the
    /// async store's connections carry it.
    fn sync_clock_sync(&self, conn: &mut impl Connection<Backend = Pg>) -> Result<(), StoreError> {
        if let Some(shift) = self.statements.config.shift_micros() {
            diesel::sql_query(self.statements.queries.sync_clock.as_str())
                .bind::<BigInt, _>(shift)
                .execute(conn)
                .store()?;
        }
        Ok(())
    }
}
