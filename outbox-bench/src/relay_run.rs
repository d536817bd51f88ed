//! Drives one relay over a filled outbox until every event is delivered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::store::{OutboxAdmin, OutboxStore};
use outbox_core::{CancellationToken, Publisher, Relay, RelayConfig, RelayReport};

use crate::counting::CountingPublisher;
use crate::env::Error;

/// How long a drain may take before the harness calls events lost.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// The relay settings every drain uses: the defaults, with `batch_size`
/// and `ordering` as the contender says.
pub fn config(batch_size: usize, ordering: outbox_core::Ordering) -> RelayConfig {
    RelayConfig {
        batch_size,
        ordering,
        ..RelayConfig::default()
    }
}

/// Runs `relays` relays over `store` until `publisher` has delivered
/// `expected` events, stops them gracefully and returns the time from
/// start to the last settlement written. Errors if events go missing (the
/// deliveries never arrive), a relay reports failures, or the store still
/// holds an open event afterwards.
pub async fn drain<S, P>(
    store: Arc<S>,
    publisher: Arc<CountingPublisher<P>>,
    config: RelayConfig,
    relays: usize,
    expected: u64,
) -> Result<Duration, Error>
where
    S: OutboxStore + OutboxAdmin + 'static,
    P: Publisher + 'static,
{
    drain_relays(store, publisher, config, relays, expected, 0).await
}

/// Like [`drain`] with one relay, where exactly `left_open` events must
/// stay open (claimable, parked, in flight or failed) afterwards: a
/// troubled key's, which the relay must not deliver.
pub async fn drain_leaving<S, P>(
    store: Arc<S>,
    publisher: Arc<CountingPublisher<P>>,
    config: RelayConfig,
    expected: u64,
    left_open: usize,
) -> Result<Duration, Error>
where
    S: OutboxStore + OutboxAdmin + 'static,
    P: Publisher + 'static,
{
    drain_relays(store, publisher, config, 1, expected, left_open).await
}

async fn drain_relays<S, P>(
    store: Arc<S>,
    publisher: Arc<CountingPublisher<P>>,
    config: RelayConfig,
    relays: usize,
    expected: u64,
    left_open: usize,
) -> Result<Duration, Error>
where
    S: OutboxStore + OutboxAdmin + 'static,
    P: Publisher + 'static,
{
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let ended = Arc::new(tokio::sync::Notify::new());
    let handles: Vec<_> = (0..relays)
        .map(|i| {
            let config = RelayConfig {
                relay_id: outbox_core::store::RelayId::new(format!("bench-{i}")),
                ..config.clone()
            };
            let relay = Relay::new(store.clone(), publisher.clone(), config)?;
            let (shutdown, ended) = (shutdown.clone(), ended.clone());
            Ok(tokio::spawn(async move {
                let result = relay.run(shutdown).await;
                ended.notify_one();
                result
            }))
        })
        .collect::<Result<_, Error>>()?;
    // A relay that stops by itself (a store error retrying cannot cure)
    // ends the wait at once instead of after the drain limit.
    let reached = tokio::time::timeout(DRAIN_LIMIT, async {
        tokio::select! {
            _ = publisher.wait_for(expected) => {}
            _ = ended.notified() => {}
        }
    })
    .await;
    shutdown.cancel();
    let mut total = RelayReport::default();
    for handle in handles {
        let report = handle.await??;
        total.published += report.published;
        total.failed += report.failed;
        total.store_errors += report.store_errors;
    }
    let elapsed = started.elapsed();
    if reached.is_err() {
        return Err(format!(
            "only {} of {expected} events delivered within {DRAIN_LIMIT:?}",
            publisher.delivered()
        )
        .into());
    }
    if total.failed > 0 || total.published < expected {
        return Err(format!("relay report shows a loss: {total:?}").into());
    }
    if publisher.delivered() > expected {
        return Err(format!(
            "{} deliveries of {expected} events: a troubled key's events went out",
            publisher.delivered()
        )
        .into());
    }
    crate::env::check_left_open(store.as_ref(), expected as usize, left_open).await?;
    Ok(elapsed)
}
