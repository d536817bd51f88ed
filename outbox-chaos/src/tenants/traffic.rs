//! The tenants soak's traffic: Zipf tenants at a steady rate, bursts on
//! the hot tenant, and tenants created and dropped while it runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::policy::{RandomSource, SplitMix64};
use outbox_core::{CancellationToken, EventId, NewEvent};
use outbox_sqlx::postgres::PgStore;
use outbox_sqlx::{StoreConfig, TableNames};

use super::{HOT, Observed, Sent, Settings, now_ms};
use crate::Error;
use crate::soak::{Zipf, burst_transactions, enqueue_retrying, pace};

/// The tenants taking traffic now (the hot one aside), oldest first, and
/// how many were made.
#[derive(Default)]
pub(super) struct Live {
    pub(super) tenants: Vec<String>,
    pub(super) made: usize,
}

/// A tenant schema with migrated outbox tables.
pub(super) async fn make_tenant(pool: &sqlx::PgPool, tenant: &str) -> Result<(), Error> {
    sqlx::query(&format!("CREATE SCHEMA {tenant}"))
        .execute(pool)
        .await
        .map_err(|e| format!("creating schema {tenant}: {e}"))?;
    store(pool, tenant)?
        .migrate()
        .await
        .map_err(|e| format!("migrating tenant {tenant}: {e}"))?;
    Ok(())
}

/// Drops a tenant's schema the way an operator would while the daemon
/// runs it: `DROP SCHEMA … CASCADE` takes its tables' locks one by one and
/// can meet the tenant's relay mid-claim holding one of them, and
/// PostgreSQL then ends one of the two with `deadlock detected` (SQLSTATE
/// 40P01). The drop is tried again; the relay's side is retried by the
/// fleet. Returns how many times it was retried.
async fn drop_tenant(pool: &sqlx::PgPool, tenant: &str) -> Result<usize, Error> {
    const DEADLOCK: &str = "40P01";
    let mut tries = 0;
    loop {
        tries += 1;
        match sqlx::query(&format!("DROP SCHEMA {tenant} CASCADE"))
            .execute(pool)
            .await
        {
            Ok(_) => return Ok(tries - 1),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(DEADLOCK) && tries < 5 => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("dropping schema {tenant} ({tries} tries): {e}").into()),
        }
    }
}

fn store(pool: &sqlx::PgPool, tenant: &str) -> Result<PgStore, Error> {
    let tables = TableNames::default().in_schema(tenant)?;
    Ok(PgStore::new(pool.clone(), StoreConfig::with_tables(tables)))
}

pub(super) fn tenant_name(n: usize) -> String {
    format!("t_{n:04}")
}

/// What the producer and the churner share.
#[derive(Clone)]
pub(super) struct Traffic {
    pub pool: sqlx::PgPool,
    pub settings: Settings,
    pub live: Arc<tokio::sync::Mutex<Live>>,
    pub observed: Arc<Mutex<Observed>>,
    pub done: CancellationToken,
}

/// Zipf over the live tenants at `rate` in transactions of 5, and every
/// `burst_every` a burst on the hot tenant (transactions of 500), each
/// commit recorded; retried through outages (same ids).
pub(super) async fn produce(traffic: Traffic) -> Result<(), Error> {
    let Traffic {
        pool,
        settings,
        live,
        observed,
        done,
    } = traffic;
    let random = SplitMix64::from_entropy();
    let zipf = Zipf::new(settings.tenants - 1, 1.0);
    let mut stores: HashMap<String, PgStore> = HashMap::new();
    let started = Instant::now();
    let mut next_burst = started + settings.burst_every / 2;
    let mut produced = 0usize;
    let event = |tenant: &str, n: usize| {
        NewEvent::builder("invoice.paid", "invoice", format!("inv-{tenant}-{n}"))
            .event_id(EventId::random())
            .partition_key(format!("k{}", n % 50))
            .payload(&serde_json::json!({ "tenant": tenant }))
            .build()
            .expect("a valid event")
    };
    while !done.is_cancelled() {
        if Instant::now() >= next_burst {
            next_burst += settings.burst_every;
            let hot = stores
                .entry(HOT.into())
                .or_insert(store(&pool, HOT)?)
                .clone();
            let from = now_ms();
            for size in burst_transactions(settings.burst_events) {
                let batch: Vec<NewEvent> = (0..size).map(|n| event(HOT, n)).collect();
                commit(&hot, HOT, &batch, true, &observed).await?;
            }
            let burst = (from, now_ms());
            observed.lock().expect("observed").bursts.push(burst);
            continue;
        }
        // Held over the commit: a tenant leaves only between commits.
        let live = live.lock().await;
        let tenant = live.tenants[zipf.sample(random.next_unit())].clone();
        let target = match stores.get(&tenant) {
            Some(store) => store.clone(),
            None => {
                let made = store(&pool, &tenant)?;
                stores.insert(tenant.clone(), made.clone());
                made
            }
        };
        let batch: Vec<NewEvent> = (0..5).map(|n| event(&tenant, produced + n)).collect();
        commit(&target, &tenant, &batch, false, &observed).await?;
        drop(live);
        produced += batch.len();
        pace(started, produced, settings.rate, &done).await;
    }
    Ok(())
}

async fn commit(
    store: &PgStore,
    tenant: &str,
    batch: &[NewEvent],
    hot: bool,
    observed: &Mutex<Observed>,
) -> Result<(), Error> {
    enqueue_retrying(store, batch)
        .await
        .map_err(|error| format!("enqueue into {tenant}: {error}"))?;
    let at = now_ms();
    let mut observed = observed.lock().expect("observed");
    for event in batch {
        observed.sent.insert(
            event.event_id,
            Sent {
                tenant: tenant.to_owned(),
                committed_ms: at,
                hot,
            },
        );
    }
    Ok(())
}

/// Every `churn_every`: a new tenant schema (taking traffic at once, its
/// relay started by the daemon's next refresh) and the oldest tenant
/// dropped once its last event is published (it stops taking traffic
/// first; the daemon's next refresh stops its relay).
pub(super) async fn churn(traffic: Traffic) -> Result<(), Error> {
    let Traffic { pool, live, .. } = &traffic;
    let (settings, observed, done) = (&traffic.settings, &traffic.observed, &traffic.done);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(settings.churn_every) => {}
            _ = done.cancelled() => return Ok(()),
        }
        let tenant = {
            let mut live = live.lock().await;
            live.made += 1;
            tenant_name(live.made - 1)
        };
        make_tenant(pool, &tenant).await?;
        observed
            .lock()
            .expect("observed")
            .joined
            .insert(tenant.clone(), now_ms());
        // The producer commits holding the list: once it is ours, the
        // leaving tenant's last commit is over. It goes once everything it
        // committed is published.
        let leaving = {
            let mut live = live.lock().await;
            live.tenants.push(tenant);
            live.tenants.remove(0)
        };
        let leaving_store = store(pool, &leaving)?;
        // A redeploy can fall inside this wait (the old process drains,
        // the new one starts every tenant on its few connections): 90 s
        // covers one on a loaded two-core CI machine. Publication's speed
        // is measured by the latency checks, not here.
        let published = tokio::time::timeout(Duration::from_secs(90), async {
            loop {
                let stats = outbox_core::store::OutboxAdmin::stats(&leaving_store).await?;
                if stats
                    .iter()
                    .all(|s| s.claimable + s.parked + s.in_flight == 0)
                {
                    return Ok::<_, Error>(());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        match published {
            Ok(result) => result?,
            Err(_) => {
                return Err(
                    format!("tenant {leaving}'s events were not published within 90 s").into(),
                );
            }
        }
        let retried = drop_tenant(pool, &leaving).await?;
        let mut observed = observed.lock().expect("observed");
        observed.dropped += 1;
        observed.drops_retried += retried;
    }
}
