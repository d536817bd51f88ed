//! The claim that sets a hot key's burst aside (part of the `claim`
//! scenario). A full batch is in flight, claimed less than a second ago:
//! the hot key's events and 246 other keys' (a hot key's relay takes other
//! keys' events beside its own). Then a transaction of 1,000 more events of
//! the hot key commits, and 20 events of keys not in flight. The next claim
//! (another relay's) cannot take the hot key's rows: it moves them into the
//! key's lane and takes the 20 behind them. Of a burst's claims it holds
//! the claim lock the longest (BENCHMARKS.md), and every other key's claim
//! waits for it. Each measured claim is undone in SQL (its lease and the
//! lanes deleted, the cursor and the window hint put back, the batch in
//! flight made young again), so every claim finds the same state.

use std::time::{Duration, Instant};

use outbox_core::store::{ClaimRequest, OutboxStore, RelayId};
use outbox_core::{NewEvent, Ordering, PoisonPolicy};
use outbox_sqlx::postgres::PgStore;
use outbox_sqlx::{StoreConfig, TableNames};
use sqlx::{Executor, PgPool};

use crate::env::{self, Error};

/// Contender name.
pub const NAME: &str = "set-aside-1000";
const SCHEMA: &str = "claim_set_aside";
const HOT_KEY: &str = "hot";
const BURST: usize = 1_000;
const OTHERS: usize = 20;
/// Other keys in the batch in flight beside the hot key.
const IN_FLIGHT_KEYS: usize = 246;
const BATCH: usize = 256;

fn request(owner: &str) -> ClaimRequest {
    ClaimRequest {
        owner: RelayId::new(owner),
        limit: BATCH,
        lease_duration: Duration::from_secs(600),
        ordering: Ordering::PerKey,
        poison: PoisonPolicy::Skip,
        crash_loop_limit: 5,
    }
}

fn hot_event(i: usize) -> NewEvent {
    env::event_on_key(HOT_KEY, &format!("hot-{i}"), i)
}

/// The store in its state: 246 keys' events and the hot key's first 10 in
/// flight (relay `hot`), the burst and the others' events behind them in
/// claim order.
pub async fn prepare(pool: &PgPool) -> Result<PgStore, Error> {
    pool.execute(&*format!(
        "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA};"
    ))
    .await?;
    let tables = TableNames::default().in_schema(SCHEMA)?;
    let store = PgStore::new(pool.clone(), StoreConfig::with_tables(tables));
    store.migrate().await?;
    let commit = async |events: Vec<NewEvent>| -> Result<(), Error> {
        let mut tx = pool.begin().await?;
        store.enqueue(&mut tx, &events).await?;
        tx.commit().await?;
        Ok(())
    };
    commit(
        (0..IN_FLIGHT_KEYS)
            .map(|i| env::event_for_key(0, i, i))
            .collect(),
    )
    .await?;
    commit((0..10).map(hot_event).collect()).await?;
    let in_flight = store.claim_batch(&request("hot")).await?;
    if in_flight.events.len() != IN_FLIGHT_KEYS + 10 {
        return Err(format!("the batch in flight: {} events", in_flight.events.len()).into());
    }
    commit((10..10 + BURST).map(hot_event).collect()).await?;
    commit(
        (0..OTHERS)
            .map(|i| env::event_for_key(1, i, IN_FLIGHT_KEYS + i))
            .collect(),
    )
    .await?;
    pool.execute(&*format!("VACUUM ANALYZE {SCHEMA}.outbox_events"))
        .await?;
    Ok(store)
}

/// `count` claims of another relay, each undone right after; their
/// latencies in ms.
pub async fn claim_and_undo(
    store: &PgStore,
    pool: &PgPool,
    count: usize,
) -> Result<Vec<f64>, Error> {
    let request = request("other");
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        // Young again: a batch in flight for less than a second holds the
        // cursor unless the claim sets its key's rows aside.
        pool.execute(&*format!(
            "UPDATE {SCHEMA}.outbox_leases SET claimed_at = now(), expires_at = now() + interval '10 minutes'
             WHERE owner = 'hot'"
        ))
        .await?;
        let (position, hint): (i64, i64) = sqlx::query_as(&format!(
            "SELECT (SELECT position FROM {SCHEMA}.outbox_cursor_now),
                    (SELECT last_value FROM {SCHEMA}.outbox_pass_window)"
        ))
        .fetch_one(pool)
        .await?;
        let started = Instant::now();
        let batch = store.claim_batch(&request).await?;
        latencies.push(started.elapsed().as_secs_f64() * 1_000.0);
        let aside: i64 = sqlx::query_scalar(&format!(
            "SELECT coalesce(sum(size), 0)::bigint FROM {SCHEMA}.outbox_lanes"
        ))
        .fetch_one(pool)
        .await?;
        if batch.events.len() != OTHERS || aside != BURST as i64 {
            return Err(format!(
                "{NAME}: claimed {} of {OTHERS}, set {aside} of {BURST} aside",
                batch.events.len()
            )
            .into());
        }
        pool.execute(&*format!(
            "DELETE FROM {SCHEMA}.outbox_leases WHERE owner = 'other';
             DELETE FROM {SCHEMA}.outbox_lanes;"
        ))
        .await?;
        super::claim::put_cursor_back(pool, SCHEMA, position).await?;
        sqlx::query(&format!("SELECT setval('{SCHEMA}.outbox_pass_window', $1)"))
            .bind(hint)
            .execute(pool)
            .await?;
    }
    Ok(latencies)
}
