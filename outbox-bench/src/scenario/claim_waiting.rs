//! Keys that wait beside the claim scenario's backlog (part of `claim`):
//! [`BLOCKED`] keys whose head failed under `PoisonPolicy::Block`, with
//! [`PARKED`] events parked behind each (they wait for an operator, maybe
//! for days), [`DELAYED`] events scheduled an hour later, each on its own
//! key, or [`RETRYING`] keys whose head backs off for an hour after a
//! failed publish (a broker outage), an event behind each set aside in its
//! lane. Every other key's claim must cost what it costs beside none
//! (`retained-0`).

use std::time::Duration;

use outbox_core::store::{ClaimRequest, OutboxStore, OutboxWriter, RelayId};
use outbox_core::{NewEvent, Ordering, PoisonPolicy};
use outbox_sqlx::postgres::PgStore;

use crate::env::{self, Error};

/// Contender with blocked keys.
pub const BLOCKED_NAME: &str = "blocked-100x300";
/// Contender with delayed events.
pub const DELAYED_NAME: &str = "delayed-10k";
/// Contender with keys backing off.
pub const RETRYING_NAME: &str = "retrying-10k";
/// Every contender of this module.
pub const NAMES: [&str; 3] = [BLOCKED_NAME, DELAYED_NAME, RETRYING_NAME];
const BLOCKED: usize = 100;
const PARKED: usize = 300;
const DELAYED: usize = 10_000;
const RETRYING: usize = 10_000;

fn key(k: usize) -> String {
    format!("blocked-{k}")
}

fn blocked_event(k: usize, n: usize) -> NewEvent {
    env::event_on_key(&key(k), &format!("blocked-{k}-{n}"), n)
}

/// Sets up contender `name`'s waiting keys in `store`; the claims that
/// move their events out of the stream leave the cursor past them.
pub async fn prepare(store: &PgStore, schema: &str, name: &str) -> Result<(), Error> {
    match name {
        BLOCKED_NAME => block_keys(store, schema).await,
        DELAYED_NAME => delay_events(store, schema).await,
        RETRYING_NAME => back_off_keys(store, schema).await,
        _ => Ok(()),
    }
}

fn waiting_request() -> ClaimRequest {
    ClaimRequest {
        owner: RelayId::new("bench-waiting"),
        limit: 1_000,
        lease_duration: Duration::from_secs(600),
        ordering: Ordering::PerKey,
        poison: PoisonPolicy::Block,
        crash_loop_limit: 5,
    }
}

/// Claims until `expected` rows have `status`; none may be claimed.
async fn claim_until_moved(
    store: &PgStore,
    schema: &str,
    status: i16,
    expected: usize,
) -> Result<(), Error> {
    let count = format!("SELECT count(*) FROM {schema}.outbox_events WHERE status = {status}");
    claim_until_counted(store, &count, expected).await
}

/// Claims until `count` (SQL) says `expected`; none may be claimed.
async fn claim_until_counted(store: &PgStore, count: &str, expected: usize) -> Result<(), Error> {
    for _ in 0..1_000 {
        let claimed = store.claim_batch(&waiting_request()).await?;
        if !claimed.events.is_empty() {
            return Err("a waiting key's event was claimed".into());
        }
        let moved: i64 = sqlx::query_scalar(count).fetch_one(store.pool()).await?;
        if moved as usize == expected {
            return Ok(());
        }
    }
    Err(format!("claims did not reach {expected}: {count}").into())
}

/// [`DELAYED`] events due in an hour, each on its own key.
async fn delay_events(store: &PgStore, schema: &str) -> Result<(), Error> {
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let delayed: Vec<NewEvent> = (0..DELAYED)
        .map(|k| {
            let mut event = env::event_on_key(&format!("delayed-{k}"), &format!("delayed-{k}"), k);
            event.available_at = Some(later);
            event
        })
        .collect();
    OutboxWriter::enqueue(store, &delayed).await?;
    claim_until_moved(store, schema, 4, DELAYED).await
}

/// Blocks [`BLOCKED`] keys of `store` and parks [`PARKED`] events behind each,
/// moved out of the stream by claims as a relay's would (the cursor ends
/// past them).
async fn block_keys(store: &PgStore, schema: &str) -> Result<(), Error> {
    let request = waiting_request();
    let heads: Vec<NewEvent> = (0..BLOCKED).map(|k| blocked_event(k, 0)).collect();
    OutboxWriter::enqueue(store, &heads).await?;
    let claimed = store.claim_batch(&request).await?;
    if claimed.events.len() != BLOCKED {
        return Err(format!("claimed {} of {BLOCKED} heads", claimed.events.len()).into());
    }
    env::block_all(store, &claimed.events).await?;
    let behind: Vec<NewEvent> = (1..=PARKED)
        .flat_map(|n| (0..BLOCKED).map(move |k| blocked_event(k, n)))
        .collect();
    OutboxWriter::enqueue(store, &behind).await?;
    claim_until_moved(store, schema, 5, BLOCKED * PARKED).await
}

/// [`RETRYING`] keys whose head a claim took and nacked with a retry in an
/// hour, then an event behind each, set aside in its key's lane.
async fn back_off_keys(store: &PgStore, schema: &str) -> Result<(), Error> {
    let key = |k: usize| format!("retrying-{k}");
    let heads: Vec<NewEvent> = (0..RETRYING)
        .map(|k| env::event_on_key(&key(k), &format!("retrying-{k}-0"), k))
        .collect();
    OutboxWriter::enqueue(store, &heads).await?;
    let mut nacked = 0;
    while nacked < RETRYING {
        let claimed = store.claim_batch(&waiting_request()).await?;
        if claimed.events.is_empty() {
            return Err(format!("claimed {nacked} of {RETRYING} heads").into());
        }
        env::back_off_all(store, &claimed.events).await?;
        nacked += claimed.events.len();
    }
    let behind: Vec<NewEvent> = (0..RETRYING)
        .map(|k| env::event_on_key(&key(k), &format!("retrying-{k}-1"), k))
        .collect();
    OutboxWriter::enqueue(store, &behind).await?;
    let laned = format!("SELECT coalesce(sum(size - taken), 0)::bigint FROM {schema}.outbox_lanes");
    claim_until_counted(store, &laned, RETRYING).await
}
