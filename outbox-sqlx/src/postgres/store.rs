//! [`PgStore`]: the outbox on PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};

use async_trait::async_trait;
use outbox_core::store::{
    ClaimRequest, ClaimedBatch, EnqueueOutcome, FencingToken, Heartbeat, Lease, Nack, OutboxStore,
    OutboxWriter, Release, SettleReport,
};
use outbox_core::{EventId, NewEvent, Ordering, PoisonPolicy, StoreError, UnreadableEvent};
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::kept::KeptConnection;
use super::queries::Queries;
use super::row;
use crate::config::{Migrated, StoreConfig};
use crate::error::ResultExt;
use outbox_sql::enqueue::EnqueueColumns;
use outbox_sql::settle::{ClaimRow, NackColumns, SortedClaim, sort_claim};

/// The version of the schema the store creates; tables of another version
/// are refused by `migrate` (see the CHANGELOG's upgrade notes).
pub use outbox_sql::postgres::SCHEMA_VERSION;

/// The outbox, attempt history, inbox and relay tables on PostgreSQL (≥ 13).
///
/// Clones share the pool. Enqueue inside your own transaction with
/// [`PgStore::enqueue`] (or, from another language, the `outbox_enqueue`
/// SQL function); run relays over the store with [`outbox_core::Relay`],
/// woken by [`PgStore::wake_up`]. The crate README explains the design.
#[derive(Clone)]
pub struct PgStore {
    pub(super) pool: PgPool,
    pub(super) config: StoreConfig,
    pub(super) queries: Arc<Queries>,
    /// The last claim found nothing: the next one asks first whether there
    /// is anything to claim (one statement instead of the claim). A
    /// wake-up that already knows (it asked, or was notified) clears it.
    pub(super) idle: Arc<AtomicBool>,
    pub(super) wake: Arc<WakeState>,
    /// Connections kept for claims (and idle probes) and for settlements.
    claims: KeptConnection,
    settlements: KeptConnection,
}

/// What the idle probe and the wake-ups of one store share.
#[derive(Debug, Default)]
pub(super) struct WakeState {
    /// Wake-ups listening: the idle probe (re)registers for NOTIFY.
    pub(super) listeners: AtomicUsize,
    /// The last idle probe found nothing and set `relay_waiting` itself:
    /// a producer may have read the flag just before, so look again soon.
    pub(super) registered_now: AtomicBool,
    /// The last idle probe found nothing (a wake-up need not ask again).
    pub(super) probed_idle: AtomicBool,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("tables", &self.config.tables)
            .finish_non_exhaustive()
    }
}

/// What the idle probe learnt.
pub(super) struct Probe {
    pub(super) anything: bool,
    pub(super) registered: bool,
}

impl PgStore {
    /// A store over `pool`. Table names were validated when built.
    pub fn new(pool: PgPool, config: StoreConfig) -> Self {
        let queries = Arc::new(Queries::new(&config.tables));
        Self {
            pool,
            config,
            queries,
            idle: Arc::new(AtomicBool::new(false)),
            wake: Arc::default(),
            claims: KeptConnection::default(),
            settlements: KeptConnection::default(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The NOTIFY channel of these tables (schema and prefix).
    pub fn channel(&self) -> &str {
        &self.queries.channel
    }

    /// The settings.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The claim statement, for `EXPLAIN` and review: a call of the
    /// `outbox_claim` function that [`PgStore::schema_sql`] installs.
    /// Parameters: `$1` owner, `$2` limit, `$3` lease in milliseconds, `$4`
    /// crash-loop limit, `$5` per-key order, `$6` block on poison.
    pub fn claim_statement(&self) -> &str {
        &self.queries.claim
    }

    /// The schema DDL and functions for these table names and limits (what
    /// [`PgStore::migrate`] runs; `migrations/postgres/` holds it rendered
    /// with the defaults).
    pub fn schema_sql(&self) -> String {
        outbox_sql::postgres::schema_sql(&self.config, &self.queries)
    }

    /// Creates or updates the tables, indexes, trigger and functions.
    /// Idempotent and quiet; concurrent callers take turns. Reports the
    /// schema version found and left; tables of another schema version are
    /// refused with [`StoreError::Config`] naming the upgrade notes, before
    /// anything is changed.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        use outbox_sql::postgres::{MIGRATE_ATTEMPTS, migrate_locks_unavailable, migrate_pause};
        crate::error::during("migrate", || self.config().tables.events(), async move {
            for attempt in 1..=MIGRATE_ATTEMPTS {
                if let Some(migrated) = self.migrate_once().await? {
                    return Ok(migrated);
                }
                tokio::time::sleep(migrate_pause(attempt)).await;
            }
            Err(migrate_locks_unavailable())
        })
        .await
    }

    /// One attempt: nothing to do on tables that recorded this schema's
    /// fingerprint (no DDL, no lock but the migrations' own advisory one);
    /// otherwise the DDL, each lock waited for at most
    /// `MIGRATE_LOCK_TIMEOUT_MS` so producers never queue behind it long.
    /// `None` when a lock was not granted in time (rolled back).
    async fn migrate_once(&self) -> Result<Option<Migrated>, StoreError> {
        let mut tx = crate::pool::begin(&self.pool).await?;
        sqlx::query(&self.queries.migrate_lock)
            .execute(&mut *tx)
            .await
            .store()?;
        let found = self.installed_version(&mut tx).await?;
        let migrated = crate::config::check_schema_version(
            &self.config.tables.events(),
            found,
            SCHEMA_VERSION,
        )?;
        let fingerprint = outbox_sql::postgres::schema_fingerprint(&self.config, &self.queries);
        let present: bool = sqlx::query_scalar(&self.queries.applied_table)
            .fetch_one(&mut *tx)
            .await
            .store()?;
        if present {
            let applied: Option<String> = sqlx::query_scalar(&self.queries.applied_fingerprint)
                .fetch_one(&mut *tx)
                .await
                .store()?;
            if applied.as_deref() == Some(fingerprint.as_str()) {
                tx.commit().await.store()?;
                return Ok(Some(migrated));
            }
        }
        sqlx::query(&outbox_sql::postgres::migrate_lock_timeout())
            .execute(&mut *tx)
            .await
            .store()?;
        match sqlx::Executor::execute(&mut *tx, sqlx::raw_sql(&self.schema_sql())).await {
            Ok(_) => {}
            Err(sqlx::Error::Database(db))
                if db.code().as_deref() == Some(outbox_sql::postgres::LOCK_NOT_AVAILABLE) =>
            {
                tx.rollback().await.store()?;
                return Ok(None);
            }
            Err(error) => return Err(error).store(),
        }
        tx.commit().await.store()?;
        Ok(Some(migrated))
    }

    /// The schema version of the outbox tables: `None` if there are none,
    /// 1 for tables made before the version record existed.
    pub async fn schema_version(&self) -> Result<Option<i32>, StoreError> {
        let mut conn = self.pool.acquire().await.store()?;
        self.installed_version(&mut conn).await
    }

    async fn installed_version(&self, conn: &mut PgConnection) -> Result<Option<i32>, StoreError> {
        let (events, record): (Option<String>, Option<String>) =
            sqlx::query_as(&self.queries.installed_tables)
                .fetch_one(&mut *conn)
                .await
                .store()?;
        let version = match (&events, &record) {
            (Some(_), Some(_)) => sqlx::query_scalar(&self.queries.installed_version)
                .fetch_one(&mut *conn)
                .await
                .store()?,
            _ => None,
        };
        Ok(outbox_sql::config::installed_version(
            events.is_some(),
            record.is_some(),
            version,
        ))
    }

    /// Tests shift store time ([`outbox_core::StoreTime::Shifted`]): the
    /// shift is kept in the database, so every handle agrees.
    pub(super) async fn sync_clock(&self) -> Result<(), StoreError> {
        if let Some(shift) = self.config.shift_micros() {
            sqlx::query(&self.queries.sync_clock)
                .bind(shift)
                .execute(&self.pool)
                .await
                .store()?;
        }
        Ok(())
    }

    /// Enqueues `events` on `conn`, typically `&mut *tx` of the business
    /// transaction, in one statement. Each outcome says whether a row was
    /// written or the `event_id` already existed (a no-op). Invalid events
    /// are refused before anything is sent, so the caller's transaction
    /// stays usable.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        events: &[NewEvent],
    ) -> Result<Vec<EnqueueOutcome>, StoreError> {
        crate::error::during("enqueue", || self.config().tables.events(), async move {
            let columns = EnqueueColumns::checked(events, &self.config, true)?;
            if events.is_empty() {
                return Ok(Vec::new());
            }
            let rows = sqlx::query(&self.queries.enqueue)
                .bind(columns.event_ids)
                .bind(columns.aggregate_types)
                .bind(columns.aggregate_ids)
                .bind(columns.event_types)
                .bind(columns.partition_keys)
                .bind(columns.payloads)
                .bind(columns.payload_versions)
                .bind(columns.headers)
                .bind(columns.delays_ms)
                .fetch_all(conn)
                .await
                .store()?;
            let inserted = rows
                .iter()
                .map(|row| {
                    Ok((
                        row.try_get("event_id").store()?,
                        row.try_get("sequence").store()?,
                    ))
                })
                .collect::<Result<Vec<(Uuid, i64)>, StoreError>>()?;
            Ok(outbox_sql::enqueue::outcomes(events, inserted))
        })
        .await
    }

    /// One statement: is there anything to claim? With a wake-up attached,
    /// it also (re)sets `relay_waiting`.
    pub(super) async fn probe(&self) -> Result<Probe, StoreError> {
        let register = self.wake.listeners.load(AtomicOrdering::Relaxed) > 0;
        let mut kept = self.claims.lock(&self.pool).await?;
        let row = match sqlx::query(&self.queries.probe)
            .bind(register)
            .fetch_one(kept.conn())
            .await
        {
            Ok(row) => row,
            Err(error) => {
                kept.discard();
                return Err(error).store();
            }
        };
        let probe = Probe {
            anything: row.try_get("anything").store()?,
            registered: row.try_get("registered").store()?,
        };
        self.wake
            .probed_idle
            .store(!probe.anything, AtomicOrdering::Relaxed);
        self.wake
            .registered_now
            .store(probe.registered, AtomicOrdering::Relaxed);
        Ok(probe)
    }

    /// Producer transactions still open among `watched` (every one that
    /// inserted events, if `None`), and whether anything is claimable once
    /// they are seen.
    pub(super) async fn watch_producers(
        &self,
        watched: Option<&[String]>,
    ) -> Result<(Vec<String>, bool), StoreError> {
        let mut kept = self.claims.lock(&self.pool).await?;
        let row = match sqlx::query(&self.queries.watch_producers)
            .bind(watched)
            .fetch_one(kept.conn())
            .await
        {
            Ok(row) => row,
            Err(error) => {
                kept.discard();
                return Err(error).store();
            }
        };
        Ok((
            row.try_get("in_flight").store()?,
            row.try_get("anything").store()?,
        ))
    }

    /// Acks `leases` on `conn` (a transaction of the caller's, for tests
    /// that hold a settlement open).
    #[cfg(feature = "testing")]
    pub(super) async fn ack_in(
        &self,
        conn: &mut PgConnection,
        leases: &[Lease],
    ) -> Result<SettleReport, StoreError> {
        let query = sqlx::query(&self.queries.ack)
            .bind(leases.iter().map(|l| l.sequence).collect::<Vec<_>>())
            .bind(leases.iter().map(|l| l.fencing_token.0).collect::<Vec<_>>());
        let rows = query.fetch_all(conn).await.store()?;
        settled_report(&rows, leases.iter().map(|l| (l.sequence, l.event_id)))
    }

    /// Runs a settlement statement returning the `sequence` of each row it
    /// settled; the rest of `asked` (sequence, event id) was fenced.
    async fn settle_sequences(
        &self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
        asked: impl Iterator<Item = (i64, EventId)>,
    ) -> Result<SettleReport, StoreError> {
        let mut kept = self.settlements.lock(&self.pool).await?;
        let rows = match query.fetch_all(kept.conn()).await {
            Ok(rows) => rows,
            Err(error) => {
                kept.discard();
                return Err(error).store();
            }
        };
        settled_report(&rows, asked)
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
        sqlx::query(&self.queries.fail_unreadable)
            .bind(
                unreadable
                    .iter()
                    .map(|(u, _)| u.event.sequence)
                    .collect::<Vec<_>>(),
            )
            .bind(unreadable.iter().map(|(_, t)| t.0).collect::<Vec<_>>())
            .bind(block_key)
            .bind(
                unreadable
                    .iter()
                    .map(|(u, _)| u.reason.as_str())
                    .collect::<Vec<_>>(),
            )
            .execute(&self.pool)
            .await
            .store()?;
        Ok(())
    }
}

/// What a settlement did: the `sequence` of each row it returned was
/// settled, the rest of `asked` (sequence, event id) was fenced.
fn settled_report(
    rows: &[sqlx::postgres::PgRow],
    asked: impl Iterator<Item = (i64, EventId)>,
) -> Result<SettleReport, StoreError> {
    let mut settled = Vec::with_capacity(rows.len());
    for row in rows {
        if let Some(sequence) = row.try_get::<Option<i64>, _>("sequence").store()? {
            settled.push(sequence);
        }
    }
    Ok(outbox_sql::settle::settled_report(settled, asked))
}

#[async_trait]
impl OutboxWriter for PgStore {
    async fn enqueue(&self, events: &[NewEvent]) -> Result<Vec<EnqueueOutcome>, StoreError> {
        crate::error::during("enqueue", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let mut tx = crate::pool::begin(&self.pool).await?;
            let outcomes = PgStore::enqueue(self, &mut tx, events).await?;
            tx.commit().await.store()?;
            Ok(outcomes)
        })
        .await
    }
}

#[async_trait]
impl OutboxStore for PgStore {
    async fn claim_batch(&self, request: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        crate::error::during(
            "claim_batch",
            || self.config().tables.events(),
            async move {
                self.sync_clock().await?;
                // While idle, one cheap statement instead of a claim.
                if self.idle.load(AtomicOrdering::Relaxed) && !self.probe().await?.anything {
                    return Ok(ClaimedBatch::default());
                }
                let lease_ms =
                    i64::try_from(request.lease_duration.as_millis()).unwrap_or(i64::MAX);
                let mut kept = self.claims.lock(&self.pool).await?;
                let rows = match sqlx::query(&self.queries.claim)
                    .bind(request.owner.as_str())
                    .bind(i32::try_from(request.limit).unwrap_or(i32::MAX))
                    .bind(lease_ms)
                    .bind(i32::try_from(request.crash_loop_limit).unwrap_or(i32::MAX))
                    .bind(request.ordering == Ordering::PerKey)
                    .bind(request.poison == PoisonPolicy::Block)
                    .fetch_all(kept.conn())
                    .await
                {
                    Ok(rows) => rows,
                    Err(error) => {
                        kept.discard();
                        return Err(error).store();
                    }
                };
                drop(kept);
                let rows = rows
                    .iter()
                    .map(|r| {
                        Ok(ClaimRow {
                            raw: row::raw_event(r)?,
                            crash_looped: r.try_get("crash_looped").store()?,
                            fencing_token: r.try_get("fencing_token").store()?,
                            lease_expires_at: r.try_get("lease_expires_at").store()?,
                        })
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?;
                let block = request.poison == PoisonPolicy::Block;
                let SortedClaim {
                    mut batch,
                    held_back,
                    unreadable,
                } = sort_claim(rows, block)?;
                self.release(&held_back).await?;
                self.fail_unreadable(&unreadable, block).await?;
                batch.unreadable = unreadable.into_iter().map(|(u, _)| u).collect();
                self.idle.store(
                    batch.events.is_empty() && batch.unreadable.is_empty(),
                    AtomicOrdering::Relaxed,
                );
                Ok(batch)
            },
        )
        .await
    }

    async fn ack(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        crate::error::during("ack", || self.config().tables.events(), async move {
            if leases.is_empty() {
                return Ok(SettleReport::default());
            }
            self.sync_clock().await?;
            let query = sqlx::query(&self.queries.ack)
                .bind(leases.iter().map(|l| l.sequence).collect::<Vec<_>>())
                .bind(leases.iter().map(|l| l.fencing_token.0).collect::<Vec<_>>());
            self.settle_sequences(query, leases.iter().map(|l| (l.sequence, l.event_id)))
                .await
        })
        .await
    }

    async fn nack(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        crate::error::during("nack", || self.config().tables.events(), async move {
            if nacks.is_empty() {
                return Ok(SettleReport::default());
            }
            self.sync_clock().await?;
            let columns = NackColumns::of(nacks);
            let query = sqlx::query(&self.queries.nack)
                .bind(columns.sequences)
                .bind(columns.tokens)
                .bind(columns.retry_after_ms)
                .bind(columns.block_key)
                .bind(columns.kinds)
                .bind(columns.classes)
                .bind(columns.errors);
            self.settle_sequences(
                query,
                nacks.iter().map(|n| (n.lease.sequence, n.lease.event_id)),
            )
            .await
        })
        .await
    }

    async fn release(&self, releases: &[Release]) -> Result<SettleReport, StoreError> {
        crate::error::during("release", || self.config().tables.events(), async move {
            if releases.is_empty() {
                return Ok(SettleReport::default());
            }
            let query = sqlx::query(&self.queries.release)
                .bind(
                    releases
                        .iter()
                        .map(|r| r.lease.sequence)
                        .collect::<Vec<_>>(),
                )
                .bind(
                    releases
                        .iter()
                        .map(|r| r.lease.fencing_token.0)
                        .collect::<Vec<_>>(),
                )
                .bind(
                    releases
                        .iter()
                        .map(|r| r.attempt_started)
                        .collect::<Vec<_>>(),
                );
            self.settle_sequences(
                query,
                releases
                    .iter()
                    .map(|r| (r.lease.sequence, r.lease.event_id)),
            )
            .await
        })
        .await
    }

    async fn heartbeat(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        crate::error::during("heartbeat", || self.config().tables.events(), async move {
            self.sync_clock().await?;
            let outage = beat.outage.as_ref();
            sqlx::query(&self.queries.heartbeat)
                .bind(beat.relay.as_str())
                .bind(self.config.clock.now())
                .bind(outage.map(|o| o.destination.as_str()))
                .bind(outage.map(|o| o.reason.as_str()))
                .execute(&self.pool)
                .await
                .store()?;
            Ok(())
        })
        .await
    }
}
