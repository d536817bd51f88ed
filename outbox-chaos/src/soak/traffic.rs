//! The soak's traffic: Zipf keys at a steady rate and bursts on one hot
//! key, each commit recorded.

use super::*;

/// Zipf keys at `rate` in transactions of 10, and every `burst_every` a
/// burst on the hot key (transactions of 500), each event's commit time
/// recorded; retried through outages (same ids).
pub(super) async fn produce(
    store: Arc<PgStore>,
    settings: Settings,
    committed: Arc<Mutex<Committed>>,
    observed: Arc<Mutex<Observed>>,
    done: CancellationToken,
) -> Result<(), Error> {
    let random = SplitMix64::from_entropy();
    let zipf = Zipf::new(settings.keys, 1.1);
    let started = Instant::now();
    let mut next_burst = started + settings.burst_every / 2;
    let mut produced = 0usize;
    let mut seq: HashMap<String, u64> = HashMap::new();
    let mut event = |key: String| {
        let n = seq.entry(key.clone()).or_default();
        *n += 1;
        NewEvent::builder("invoice.paid", "invoice", format!("inv-{key}-{n}"))
            .event_id(EventId::random())
            .partition_key(key)
            .payload(&serde_json::json!({ "seq": *n }))
            .build()
            .expect("a valid event")
    };
    while !done.is_cancelled() {
        // A burst due while a fault leaves its effects waits for calm: the
        // hot-key check needs bursts outside fault windows.
        let burst = Instant::now() >= next_burst
            && observed
                .lock()
                .expect("observed")
                .begin_burst(settings.burst_calm);
        let (batch, hot): (Vec<NewEvent>, bool) = if burst {
            next_burst += settings.burst_every;
            let from = now_ms();
            for size in burst_transactions(settings.burst_events) {
                let batch: Vec<NewEvent> = (0..size).map(|_| event(HOT_KEY.into())).collect();
                commit(&store, &batch, true, &committed, &observed).await?;
            }
            let burst = (from, now_ms());
            observed.lock().expect("observed").bursts.push(burst);
            continue;
        } else {
            (
                (0..10)
                    .map(|_| event(format!("k{}", zipf.sample(random.next_unit()))))
                    .collect(),
                false,
            )
        };
        commit(&store, &batch, hot, &committed, &observed).await?;
        produced += batch.len();
        pace(started, produced, settings.rate, &done).await;
    }
    Ok(())
}
/// A burst of `events` as the sizes of its transactions (500 each, the
/// last what is left).
pub(crate) fn burst_transactions(events: usize) -> impl Iterator<Item = usize> {
    (0..events)
        .step_by(500)
        .map(move |from| 500.min(events - from))
}

/// Waits until `produced` events at `rate` a second from `started` are
/// due (open loop: a slow commit is caught up, not skipped), or `done`.
pub(crate) async fn pace(started: Instant, produced: usize, rate: f64, done: &CancellationToken) {
    let due = started + Duration::from_secs_f64(produced as f64 / rate);
    tokio::select! {
        _ = tokio::time::sleep_until(due.into()) => {}
        _ = done.cancelled() => {}
    }
}

pub(super) async fn commit(
    store: &PgStore,
    batch: &[NewEvent],
    hot: bool,
    committed: &Mutex<Committed>,
    observed: &Mutex<Observed>,
) -> Result<(), Error> {
    enqueue_retrying(store, batch).await?;
    let at = now_ms();
    let mut committed = committed.lock().expect("committed");
    let mut observed = observed.lock().expect("observed");
    for event in batch {
        committed
            .by_key
            .entry(event.partition_key.clone())
            .or_default()
            .push(event.event_id);
        observed.sent.insert(
            event.event_id,
            Sent {
                key: event.partition_key.clone(),
                committed_ms: at,
                hot,
            },
        );
    }
    committed.total += batch.len();
    Ok(())
}
/// Enqueues `batch` in one transaction, again (same ids) while the
/// database is unavailable.
pub(crate) async fn enqueue_retrying(
    store: &PgStore,
    batch: &[NewEvent],
) -> Result<(), outbox_core::StoreError> {
    loop {
        match OutboxWriter::enqueue(store, batch).await {
            Ok(_) => return Ok(()),
            Err(error) if error.is_retryable() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Zipf over `n` keys with exponent `s`: key 0 the most frequent.
pub(crate) struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    pub(crate) fn new(n: usize, s: f64) -> Self {
        let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(s)).collect();
        let total: f64 = weights.iter().sum();
        let mut running = 0.0;
        let cumulative = weights
            .iter()
            .map(|w| {
                running += w / total;
                running
            })
            .collect();
        Self { cumulative }
    }

    pub(crate) fn sample(&self, unit: f64) -> usize {
        self.cumulative
            .partition_point(|c| *c < unit)
            .min(self.cumulative.len() - 1)
    }
}
