//! The PostgreSQL store's protocol, once for every driver: which statement
//! runs when, with which parameters, and what its rows mean.
//!
//! The claim, tick, settlement and blame logic is SQL (the functions of
//! `schema/*.sql`); what is left for Rust is binding their parameters,
//! batching settlements, sorting a claim's rows, the idle probe and the
//! connections kept for claims and settlements.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use outbox_core::store::{
    ClaimRequest, ClaimedBatch, FencingToken, Heartbeat, Lease, Nack, Release, SettleReport,
};
use outbox_core::{EventId, Ordering, PoisonPolicy, StoreError, UnreadableEvent};
use tokio::sync::{Mutex, MutexGuard};

use super::driver::{Driver, Exec, Param, texts};
use super::statements::{Statements, limit, millis};
use super::{MIGRATE_ATTEMPTS, migrate_locks_unavailable, migrate_pause};
use crate::config::{Migrated, StoreConfig};
pub(super) use crate::error::during;
use crate::settle::{NackColumns, SortedClaim, settled_report, sort_claim};

/// What the idle probe and the wake-ups of one store share.
#[derive(Debug, Default)]
pub struct WakeState {
    /// Wake-ups listening: the idle probe (re)registers for NOTIFY.
    pub listeners: AtomicUsize,
    /// The last idle probe found nothing and set `relay_waiting` itself:
    /// a producer may have read the flag just before, so look again soon.
    pub registered_now: AtomicBool,
    /// The last idle probe found nothing (a wake-up need not ask again).
    pub probed_idle: AtomicBool,
}

/// What the idle probe learnt.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// Something is claimable.
    pub anything: bool,
    /// This probe set `relay_waiting`.
    pub registered: bool,
}

/// A connection kept for one kind of relay statement (see
/// [`Driver::keep`]).
struct Kept<C>(Arc<Mutex<Option<C>>>);

impl<C> Clone for Kept<C> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<C> Default for Kept<C> {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(None)))
    }
}

/// A connection for a relay statement: the kept one, or one from the pool.
enum RelayConn<'a, C> {
    Kept(MutexGuard<'a, Option<C>>),
    Pooled(C),
}

impl<C: Exec> RelayConn<'_, C> {
    fn exec(&mut self) -> &mut C {
        match self {
            Self::Kept(slot) => slot.as_mut().expect("a kept connection"),
            Self::Pooled(conn) => conn,
        }
    }

    /// Runs `work` on the connection; after an error a kept connection is
    /// let go (it may be broken): the next statement takes a fresh one.
    async fn run<T>(
        mut self,
        work: impl AsyncFnOnce(&mut C) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let done = work(self.exec()).await;
        if done.is_err()
            && let Self::Kept(slot) = &mut self
        {
            **slot = None;
        }
        done
    }
}

/// The store over driver `D`: its pool, the state its relays share, and
/// (by `Deref`) its [`Statements`]. Clones share all of it.
pub struct Protocol<D: Driver> {
    /// The driver's pool.
    pub driver: D,
    /// The settings and statements.
    pub statements: Statements,
    /// The last claim found nothing: the next one asks first whether there
    /// is anything to claim (one statement instead of the claim). A
    /// wake-up that already knows (it asked, or was notified) clears it.
    pub idle: Arc<AtomicBool>,
    /// What the idle probe and the wake-ups share.
    pub wake: Arc<WakeState>,
    claims: Kept<D::Conn>,
    settlements: Kept<D::Conn>,
}

impl<D: Driver> Clone for Protocol<D> {
    fn clone(&self) -> Self {
        Self {
            driver: self.driver.clone(),
            statements: self.statements.clone(),
            idle: self.idle.clone(),
            wake: self.wake.clone(),
            claims: self.claims.clone(),
            settlements: self.settlements.clone(),
        }
    }
}

impl<D: Driver> std::ops::Deref for Protocol<D> {
    type Target = Statements;
    fn deref(&self) -> &Statements {
        &self.statements
    }
}

impl<D: Driver> std::ops::DerefMut for Protocol<D> {
    fn deref_mut(&mut self) -> &mut Statements {
        &mut self.statements
    }
}

impl<D: Driver> Protocol<D> {
    /// The store over `driver`'s pool on `config`'s tables.
    pub fn new(driver: D, config: StoreConfig) -> Self {
        Self {
            driver,
            statements: Statements::new(config),
            idle: Arc::default(),
            wake: Arc::default(),
            claims: Kept::default(),
            settlements: Kept::default(),
        }
    }

    async fn relay_conn<'a>(
        &self,
        kept: &'a Kept<D::Conn>,
    ) -> Result<RelayConn<'a, D::Conn>, StoreError> {
        let mut slot = kept.0.lock().await;
        if self.driver.is_closed() {
            *slot = None;
        }
        if slot.is_none() {
            match self.driver.keep().await? {
                Some(conn) => *slot = Some(conn),
                None => return Ok(RelayConn::Pooled(self.driver.connect().await?)),
            }
        }
        Ok(RelayConn::Kept(slot))
    }

    /// [`Statements::sync_clock_on`] on a pooled connection.
    pub async fn sync_clock(&self) -> Result<(), StoreError> {
        if self.config.shift_micros().is_some() {
            let mut conn = self.driver.connect().await?;
            self.sync_clock_on(&mut conn).await?;
        }
        Ok(())
    }

    /// Creates or updates the tables, indexes, trigger and functions, in
    /// one transaction per attempt. Idempotent and quiet; concurrent
    /// callers take turns. Tables of another schema version are refused
    /// with [`StoreError::Config`] naming the upgrade notes, before
    /// anything is changed.
    pub async fn migrate(&self) -> Result<Migrated, StoreError> {
        during("migrate", || self.events(), async move {
            for attempt in 1..=MIGRATE_ATTEMPTS {
                let mut tx = self.driver.begin().await?;
                if let Some(migrated) = self.migrate_in(&mut tx).await? {
                    D::commit(tx).await?;
                    return Ok(migrated);
                }
                drop(tx);
                tokio::time::sleep(migrate_pause(attempt)).await;
            }
            Err(migrate_locks_unavailable())
        })
        .await
    }

    /// The schema version of the outbox tables (see
    /// [`Statements::installed_version`]).
    pub async fn schema_version(&self) -> Result<Option<i32>, StoreError> {
        let mut conn = self.driver.connect().await?;
        self.installed_version(&mut conn).await
    }

    /// A transaction as a producer's.
    pub async fn begin_producer(&self) -> Result<D::Tx, StoreError> {
        self.driver.begin().await
    }

    /// One statement: is there anything to claim? With a wake-up attached,
    /// it also (re)sets `relay_waiting`.
    pub async fn probe(&self) -> Result<Probe, StoreError> {
        let register = self.wake.listeners.load(AtomicOrdering::Relaxed) > 0;
        let rows = self
            .relay_conn(&self.claims)
            .await?
            .run(async |conn| conn.fetch(&self.queries.probe, vec![register.into()]).await)
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::fatal("no row from the idle probe"))?;
        let probe = Probe {
            anything: row.bool("anything")?,
            registered: row.bool("registered")?,
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
    pub async fn watch_producers(
        &self,
        watched: Option<&[String]>,
    ) -> Result<(Vec<String>, bool), StoreError> {
        let params = vec![Param::OptTexts(watched.map(<[String]>::to_vec))];
        let rows = self
            .relay_conn(&self.claims)
            .await?
            .run(async |conn| conn.fetch(&self.queries.watch_producers, params).await)
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::fatal("no row from the producer watch"))?;
        Ok((row.texts("in_flight")?, row.bool("anything")?))
    }

    /// Clears `relay_waiting` (a wake-up going away).
    pub async fn stop_waiting(&self) -> Result<(), StoreError> {
        let mut conn = self.driver.connect().await?;
        conn.execute(&self.queries.stop_waiting, vec![]).await?;
        Ok(())
    }

    /// The next claim goes straight to its transaction: whoever calls this
    /// has just learnt there is something to claim.
    pub fn expect_work(&self) {
        self.idle.store(false, AtomicOrdering::Relaxed);
    }

    /// Claims a batch (`OutboxStore::claim_batch`).
    pub(crate) async fn claim_batch_now(
        &self,
        request: &ClaimRequest,
    ) -> Result<ClaimedBatch, StoreError> {
        // While idle, one cheap statement instead of a claim.
        if self.idle.load(AtomicOrdering::Relaxed) && !self.probe().await?.anything {
            return Ok(ClaimedBatch::default());
        }
        let params = vec![
            request.owner.as_str().into(),
            Param::Int(i32::try_from(request.limit).unwrap_or(i32::MAX)),
            Param::BigInt(millis(request.lease_duration)),
            Param::Int(i32::try_from(request.crash_loop_limit).unwrap_or(i32::MAX)),
            (request.ordering == Ordering::PerKey).into(),
            (request.poison == PoisonPolicy::Block).into(),
        ];
        let rows = self
            .relay_conn(&self.claims)
            .await?
            .run(async |conn| conn.fetch_claimed(&self.queries.claim, params).await)
            .await?;
        let block = request.poison == PoisonPolicy::Block;
        let SortedClaim {
            mut batch,
            held_back,
            unreadable,
        } = sort_claim(rows, block)?;
        // Release first: failing an unreadable row under Block parks its
        // key's later rows, which must be back out of their lease by then.
        if !held_back.is_empty() {
            self.release_now(&held_back).await?;
        }
        self.fail_unreadable(&unreadable, block).await?;
        batch.unreadable = unreadable.into_iter().map(|(u, _)| u).collect();
        self.idle.store(
            batch.events.is_empty() && batch.unreadable.is_empty(),
            AtomicOrdering::Relaxed,
        );
        Ok(batch)
    }

    /// Runs a settlement statement returning the `sequence` of each row it
    /// settled, on the connection kept for settlements; the rest of `asked`
    /// (sequence, event id) was fenced.
    async fn settle(
        &self,
        sql: &str,
        params: Vec<Param>,
        asked: impl Iterator<Item = (i64, EventId)>,
    ) -> Result<SettleReport, StoreError> {
        let sequences = self
            .relay_conn(&self.settlements)
            .await?
            .run(async |conn| conn.fetch_sequences(sql, params).await)
            .await?;
        Ok(settled_report(sequences.into_iter().flatten(), asked))
    }

    fn ack_params(leases: &[Lease]) -> Vec<Param> {
        vec![
            Param::BigInts(leases.iter().map(|l| l.sequence).collect()),
            Param::BigInts(leases.iter().map(|l| l.fencing_token.0).collect()),
        ]
    }

    /// Acks (`OutboxStore::ack`).
    pub(crate) async fn ack_now(&self, leases: &[Lease]) -> Result<SettleReport, StoreError> {
        self.settle(
            &self.queries.ack,
            Self::ack_params(leases),
            leases.iter().map(|l| (l.sequence, l.event_id)),
        )
        .await
    }

    /// Acks `leases` on `conn` (a transaction of the caller's, for tests
    /// that hold a settlement open).
    pub async fn ack_in(
        &self,
        conn: &mut (impl Exec + ?Sized),
        leases: &[Lease],
    ) -> Result<SettleReport, StoreError> {
        let sequences = conn
            .fetch_sequences(&self.queries.ack, Self::ack_params(leases))
            .await?;
        Ok(settled_report(
            sequences.into_iter().flatten(),
            leases.iter().map(|l| (l.sequence, l.event_id)),
        ))
    }

    /// Nacks (`OutboxStore::nack`).
    pub(crate) async fn nack_now(&self, nacks: &[Nack]) -> Result<SettleReport, StoreError> {
        let columns = NackColumns::of(nacks);
        let params = vec![
            Param::BigInts(columns.sequences),
            Param::BigInts(columns.tokens),
            Param::OptBigInts(columns.retry_after_ms),
            Param::Bools(columns.block_key),
            texts(columns.kinds),
            texts(columns.classes),
            Param::Texts(columns.errors),
        ];
        self.settle(
            &self.queries.nack,
            params,
            nacks.iter().map(|n| (n.lease.sequence, n.lease.event_id)),
        )
        .await
    }

    /// Releases (`OutboxStore::release`).
    pub(crate) async fn release_now(
        &self,
        releases: &[Release],
    ) -> Result<SettleReport, StoreError> {
        let params = vec![
            Param::BigInts(releases.iter().map(|r| r.lease.sequence).collect()),
            Param::BigInts(releases.iter().map(|r| r.lease.fencing_token.0).collect()),
            Param::Bools(releases.iter().map(|r| r.attempt_started).collect()),
        ];
        self.settle(
            &self.queries.release,
            params,
            releases
                .iter()
                .map(|r| (r.lease.sequence, r.lease.event_id)),
        )
        .await
    }

    /// Records a relay's heartbeat (`OutboxStore::heartbeat`).
    pub(crate) async fn heartbeat_now(&self, beat: &Heartbeat) -> Result<(), StoreError> {
        let outage = beat.outage.as_ref();
        let params = vec![
            beat.relay.as_str().into(),
            Param::Time(self.config.clock.now()),
            Param::OptText(outage.map(|o| o.destination.clone())),
            Param::OptText(outage.map(|o| o.reason.clone())),
        ];
        let mut conn = self.driver.connect().await?;
        conn.execute(&self.queries.heartbeat, params).await?;
        Ok(())
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
        let params = vec![
            Param::BigInts(unreadable.iter().map(|(u, _)| u.event.sequence).collect()),
            Param::BigInts(unreadable.iter().map(|(_, t)| t.0).collect()),
            block_key.into(),
            Param::Texts(unreadable.iter().map(|(u, _)| u.reason.clone()).collect()),
        ];
        let mut conn = self.driver.connect().await?;
        conn.execute(&self.queries.fail_unreadable, params).await?;
        Ok(())
    }

    /// The inbox purge's own work (`inbox_purge` wraps it): up to `most`
    /// claims older than `age`.
    pub(crate) async fn inbox_gc(&self, age: Duration, most: usize) -> Result<u64, StoreError> {
        let mut conn = self.driver.connect().await?;
        let params = vec![Param::BigInt(millis(age)), limit(most)];
        conn.execute(&self.queries.inbox_purge, params).await
    }
}
