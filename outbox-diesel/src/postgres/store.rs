//! [`PgStore`]: the relay side on diesel-async with a deadpool pool — claim,
//! settle, heartbeat, the operator's view and repairs — on `outbox-sql`'s
//! statements, the ones the sqlx store runs.

use async_trait::async_trait;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use diesel_async::AsyncPgConnection;
use diesel_async::RunQueryDsl;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use outbox_core::store::{
    ClaimRequest, ClaimedBatch, EnqueueOutcome, FencingToken, Heartbeat, Lease, Nack, OutboxStore,
    OutboxWriter, Release, SettleReport,
};
use outbox_core::{EventId, NewEvent, Ordering, PoisonPolicy, StoreError, UnreadableEvent};
use outbox_sql::postgres::Queries;
use outbox_sql::settle::{ClaimRow, NackColumns, SortedClaim, settled_report, sort_claim};
use outbox_sql::{Migrated, StoreConfig};

use super::PgOutbox;

/// A bound statement, ready to run on either connection.
type Statement<'a> =
    diesel::query_builder::BoxedSqlQuery<'a, diesel::pg::Pg, diesel::query_builder::SqlQuery>;
use super::rows::{ClaimedRow, Settled};
use crate::error::ResultExt;

/// The outbox on PostgreSQL through diesel-async: [`OutboxStore`],
/// [`OutboxWriter`], [`outbox_core::OutboxAdmin`] and (by
/// [`PgStore::inbox`]) [`outbox_core::InboxStore`] over a deadpool pool of
/// [`AsyncPgConnection`]s. Enqueue inside your own transaction with
/// [`PgStore::outbox`]'s [`PgOutbox::enqueue`]; run relays over the store
/// with [`outbox_core::Relay`] (it polls: LISTEN/NOTIFY wake-ups are the
/// sqlx store's).
#[derive(Clone)]
pub struct PgStore {
    pub(super) pool: Pool<AsyncPgConnection>,
    pub(super) outbox: PgOutbox,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("tables", &self.outbox.config.tables)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// A store over `pool` on `config`'s tables.
    pub fn new(pool: Pool<AsyncPgConnection>, config: StoreConfig) -> Self {
        Self {
            pool,
            outbox: PgOutbox::new(config),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<AsyncPgConnection> {
        &self.pool
    }

    /// Enqueue and migrate on connections of your own.
    pub fn outbox(&self) -> &PgOutbox {
        &self.outbox
    }

    /// The settings.
    pub fn config(&self) -> &StoreConfig {
        &self.outbox.config
    }

    pub(super) fn queries(&self) -> &Queries {
        &self.outbox.queries
    }

    pub(super) fn table(&self) -> String {
        self.config().tables.events()
    }

    /// Creates or updates the tables on a pooled connection (see
    /// [`PgOutbox::migrate`]).
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        let mut conn = self.conn().await?;
        self.outbox.migrate(&mut conn).await
    }

    /// A pooled connection; a pool that cannot give one is unavailable.
    pub(super) async fn conn(&self) -> Result<Object<AsyncPgConnection>, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| StoreError::Unavailable(Box::new(e)))
    }

    /// Tests shift store time: the shift is kept in the database, so every
    /// handle agrees.
    pub(super) async fn sync_clock(&self, conn: &mut AsyncPgConnection) -> Result<(), StoreError> {
        if let Some(shift) = self.config().shift_micros() {
            diesel::sql_query(self.queries().sync_clock.as_str())
                .bind::<BigInt, _>(shift)
                .execute(conn)
                .await
                .store()?;
        }
        Ok(())
    }

    /// Runs a settlement statement; the rest of `asked` was fenced off.
    async fn settle(
        &self,
        query: Statement<'_>,
        asked: impl Iterator<Item = (i64, EventId)>,
    ) -> Result<SettleReport, StoreError> {
        let mut conn = self.conn().await?;
        self.sync_clock(&mut conn).await?;
        self.settle_on(&mut conn, query, asked).await
    }

    /// [`PgStore::settle`] on `conn` (a transaction of the caller's).
    async fn settle_on(
        &self,
        conn: &mut AsyncPgConnection,
        query: Statement<'_>,
        asked: impl Iterator<Item = (i64, EventId)>,
    ) -> Result<SettleReport, StoreError> {
        let rows: Vec<Settled> = query.load(conn).await.store()?;
        Ok(settled_report(
            rows.into_iter().filter_map(|r| r.sequence),
            asked,
        ))
    }

    fn ack_statement(&self, leases: &[Lease]) -> Statement<'_> {
        diesel::sql_query(self.queries().ack.as_str())
            .into_boxed()
            .bind::<Array<BigInt>, _>(leases.iter().map(|l| l.sequence).collect::<Vec<_>>())
            .bind::<Array<BigInt>, _>(leases.iter().map(|l| l.fencing_token.0).collect::<Vec<_>>())
    }

    /// Acks `leases` on `conn` (a transaction of the caller's, for tests
    /// that hold a settlement open).
    #[cfg(feature = "testing")]
    pub(super) async fn ack_on(
        &self,
        conn: &mut AsyncPgConnection,
        leases: &[Lease],
    ) -> Result<SettleReport, StoreError> {
        self.settle_on(
            conn,
            self.ack_statement(leases),
            leases.iter().map(|l| (l.sequence, l.event_id)),
        )
        .await
    }

    /// Fails claimed rows that do not decode, each on its own (history kind
    /// `Unreadable`), out of the lease that holds them.
    async fn fail_unreadable(
        &self,
        unreadable: &[(UnreadableEvent, FencingToken)],
        block_key: bool,
    ) -> Result<(), StoreError> {
        if unreadable.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn().await?;
        diesel::sql_query(self.queries().fail_unreadable.as_str())
            .bind::<Array<BigInt>, _>(
                unreadable
                    .iter()
                    .map(|(u, _)| u.event.sequence)
                    .collect::<Vec<_>>(),
            )
            .bind::<Array<BigInt>, _>(unreadable.iter().map(|(_, t)| t.0).collect::<Vec<_>>())
            .bind::<Bool, _>(block_key)
            .bind::<Array<Text>, _>(
                unreadable
                    .iter()
                    .map(|(u, _)| u.reason.as_str())
                    .collect::<Vec<_>>(),
            )
            .execute(&mut conn)
            .await
            .store()?;
        Ok(())
    }
}

#[async_trait]
impl OutboxWriter for PgStore {
    async fn enqueue(&self, events: &[NewEvent]) -> Result<Vec<EnqueueOutcome>, StoreError> {
        use diesel_async::AsyncConnection;
        let mut conn = self.conn().await?;
        self.sync_clock(&mut conn).await?;
        let outbox = &self.outbox;
        conn.transaction::<_, crate::Error, _>(async |conn| {
            Ok(outbox.enqueue(conn, events).await?)
        })
        .await
        .map_err(|e| e.into_store_error().during("enqueue", self.table()))
    }
}

#[async_trait]
impl OutboxStore for PgStore {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        let claimed = async {
            let mut conn = self.conn().await?;
            self.sync_clock(&mut conn).await?;
            let lease_ms = i64::try_from(request.lease_duration.as_millis()).unwrap_or(i64::MAX);
            let rows: Vec<ClaimedRow> = diesel::sql_query(self.queries().claim.as_str())
                .bind::<Text, _>(request.owner.as_str())
                .bind::<Integer, _>(i32::try_from(request.limit).unwrap_or(i32::MAX))
                .bind::<BigInt, _>(lease_ms)
                .bind::<Integer, _>(i32::try_from(request.crash_loop_limit).unwrap_or(i32::MAX))
                .bind::<Bool, _>(request.ordering == Ordering::PerKey)
                .bind::<Bool, _>(request.poison == PoisonPolicy::Block)
                .load(&mut conn)
                .await
                .store()?;
            let rows = rows
                .into_iter()
                .map(|r| ClaimRow {
                    raw: r.event.raw(),
                    crash_looped: r.crash_looped,
                    fencing_token: r.fencing_token,
                    lease_expires_at: r.lease_expires_at,
                })
                .collect();
            let block = request.poison == PoisonPolicy::Block;
            let SortedClaim {
                mut batch,
                held_back,
                unreadable,
            } = sort_claim(rows, block)?;
            drop(conn);
            // Release first: failing an unreadable row under Block parks its
            // key's later rows, which must be back out of their lease by then.
            self.release(&held_back).await?;
            self.fail_unreadable(&unreadable, block).await?;
            batch.unreadable = unreadable.into_iter().map(|(u, _)| u).collect();
            Ok(batch)
        };
        claimed
            .await
            .map_err(|e: StoreError| e.during("claim_batch", self.table()))
    }

    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        if leases.is_empty() {
            return Ok(SettleReport::default());
        }
        self.settle(
            self.ack_statement(leases),
            leases.iter().map(|l| (l.sequence, l.event_id)),
        )
        .await
        .map_err(|e| e.during("ack", self.table()))
    }

    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        if nacks.is_empty() {
            return Ok(SettleReport::default());
        }
        let columns = NackColumns::of(nacks);
        let query = diesel::sql_query(self.queries().nack.as_str())
            .into_boxed()
            .bind::<Array<BigInt>, _>(columns.sequences)
            .bind::<Array<BigInt>, _>(columns.tokens)
            .bind::<Array<Nullable<BigInt>>, _>(columns.retry_after_ms)
            .bind::<Array<Bool>, _>(columns.block_key)
            .bind::<Array<Text>, _>(columns.kinds)
            .bind::<Array<Text>, _>(columns.classes)
            .bind::<Array<Text>, _>(columns.errors);
        self.settle(
            query,
            nacks.iter().map(|n| (n.lease.sequence, n.lease.event_id)),
        )
        .await
        .map_err(|e| e.during("nack", self.table()))
    }

    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        if releases.is_empty() {
            return Ok(SettleReport::default());
        }
        let query = diesel::sql_query(self.queries().release.as_str())
            .into_boxed()
            .bind::<Array<BigInt>, _>(
                releases
                    .iter()
                    .map(|r| r.lease.sequence)
                    .collect::<Vec<_>>(),
            )
            .bind::<Array<BigInt>, _>(
                releases
                    .iter()
                    .map(|r| r.lease.fencing_token.0)
                    .collect::<Vec<_>>(),
            )
            .bind::<Array<Bool>, _>(
                releases
                    .iter()
                    .map(|r| r.attempt_started)
                    .collect::<Vec<_>>(),
            );
        self.settle(
            query,
            releases
                .iter()
                .map(|r| (r.lease.sequence, r.lease.event_id)),
        )
        .await
        .map_err(|e| e.during("release", self.table()))
    }

    async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        let outage = beat.outage.as_ref();
        let write = async {
            let mut conn = self.conn().await?;
            self.sync_clock(&mut conn).await?;
            diesel::sql_query(self.queries().heartbeat.as_str())
                .bind::<Text, _>(beat.relay.as_str())
                .bind::<Timestamptz, _>(self.config().clock.now())
                .bind::<Nullable<Text>, _>(outage.map(|o| o.destination.as_str()))
                .bind::<Nullable<Text>, _>(outage.map(|o| o.reason.as_str()))
                .execute(&mut conn)
                .await
                .store()?;
            Ok(())
        };
        write
            .await
            .map_err(|e: StoreError| e.during("heartbeat", self.table()))
    }
}
