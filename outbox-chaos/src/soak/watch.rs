//! What the soak watches and how it judges: purges, status and probe
//! claims timed, what reached the broker, and the latencies by window.

use super::*;

/// The daemon's scheduled purge, on a short schedule: every batch until a
/// call returns less than the batch size.
pub(super) async fn purge(
    store: Arc<PgStore>,
    settings: Settings,
    observed: Arc<Mutex<Observed>>,
    done: CancellationToken,
) -> Result<(), Error> {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(settings.purge_every) => {}
            _ = done.cancelled() => return Ok(()),
        }
        loop {
            match store.purge_published(settings.retention, 1_000).await {
                Ok(n) => {
                    observed.lock().expect("observed").purged += n;
                    if n < 1_000 {
                        break;
                    }
                }
                Err(error) if error.is_retryable() => break,
                Err(error) => return Err(error.into()),
            }
        }
    }
}
/// Every `probe_every`: what `status` reads, timed, and one claim of one
/// event, timed and handed back unstarted (no attempt burned).
pub(super) async fn probe(
    store: Arc<PgStore>,
    settings: Settings,
    observed: Arc<Mutex<Observed>>,
    done: CancellationToken,
) -> Result<(), Error> {
    let started = Instant::now();
    let request = ClaimRequest {
        owner: RelayId::new("soak-probe"),
        limit: 1,
        lease_duration: Duration::from_secs(30),
        ordering: Ordering::PerKey,
        poison: PoisonPolicy::Skip,
        crash_loop_limit: 5,
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(settings.probe_every) => {}
            _ = done.cancelled() => return Ok(()),
        }
        let at = Instant::now();
        let status = async {
            store.stats().await?;
            store.held_back().await?;
            store.blocked_keys().await
        };
        if status.await.is_ok() {
            let ms = at.elapsed().as_secs_f64() * 1_000.0;
            observed.lock().expect("observed").status_ms.push(ms);
        }
        let at = Instant::now();
        if let Ok(batch) = store.claim_batch(&request).await {
            let ms = at.elapsed().as_secs_f64() * 1_000.0;
            observed
                .lock()
                .expect("observed")
                .claim_ms
                .push((started.elapsed(), ms));
            let releases: Vec<Release> = batch
                .events
                .iter()
                .map(|c| Release::unstarted(c.lease.clone()))
                .collect();
            let _ = store.release(&releases).await;
        }
    }
}
/// Each event's first publication time (the stream entry id's milliseconds).
/// Where a slow drain stands, for the run's log: the store's side (what is
/// claimable, leased, parked or failed) and the broker's (the stream's
/// length, and what the consumer group holds delivered but unacknowledged).
pub(super) async fn drain_progress(store: &PgStore, broker_url: &str) -> String {
    let store_side = match store.stats().await {
        Ok(stats) => {
            let sum = |f: fn(&outbox_core::store::EventTypeStats) -> u64| {
                stats.iter().map(f).sum::<u64>()
            };
            let oldest = stats
                .iter()
                .filter_map(|s| s.oldest_claimable_age)
                .max()
                .unwrap_or_default();
            format!(
                "store: {} claimable (oldest {:.1} s), {} in flight, {} parked, {} blocked, {} failed",
                sum(|s| s.claimable),
                oldest.as_secs_f64(),
                sum(|s| s.in_flight),
                sum(|s| s.parked),
                sum(|s| s.blocked),
                sum(|s| s.failed)
            )
        }
        Err(e) => format!("store: {e}"),
    };
    let broker_side = async {
        let client = redis::Client::open(broker_url)?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        let length: usize = redis::cmd("XLEN")
            .arg(STREAM)
            .query_async(&mut connection)
            .await?;
        let pending: redis::streams::StreamPendingReply =
            connection.xpending(STREAM, GROUP).await?;
        Ok::<_, redis::RedisError>(format!(
            "stream: {length} entries, {} pending in the group",
            pending.count()
        ))
    }
    .await
    .unwrap_or_else(|e| format!("stream: {e}"));
    format!("{store_side}; {broker_side}")
}
pub(crate) async fn first_publications(url: &str) -> Result<HashMap<String, u128>, Error> {
    let mut first = HashMap::new();
    crate::run::every_stream_entry(url, |entry| {
        let ms: u128 = entry
            .id
            .split('-')
            .next()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0);
        if let Some(id) = entry.get::<String>("event_id") {
            first.entry(id).or_insert(ms);
        }
    })
    .await?;
    Ok(first)
}
/// Commit→publish of the other keys' events: (p50, p99, count) while no
/// fault or burst is under way, and while a hot key's burst drains (no
/// fault meanwhile); and the hot events' p99.
pub(super) struct Latency {
    pub(super) quiet: (f64, f64, usize),
    pub(super) bursting: (f64, f64, usize),
    pub(super) hot_p99: f64,
    /// The quiet latencies split to say where a slow quiet p99 comes
    /// from: by tenth of the run (a trend or a few spikes), by whether a
    /// report held xmin at commit, and by whether a fault window ended in
    /// the ten seconds before commit (a window too narrow for what a fault
    /// leaves behind).
    quiet_split: QuietSplit,
}

#[derive(Default)]
struct QuietSplit {
    by_tenth: Vec<Vec<f64>>,
    xmin_held: Vec<f64>,
    xmin_free: Vec<f64>,
    after_fault: Vec<f64>,
    far_from_faults: Vec<f64>,
}

impl Latency {
    pub(super) fn of(observed: &Observed, published: &HashMap<String, u128>) -> Self {
        let bursts = drained_bursts(&observed.bursts, &observed.sent, published);
        // Faults, and what each leaves behind.
        let faulty = |at: u128| within(&observed.faults, at, 0, 0);
        let mut quiet = Vec::new();
        let mut bursting = Vec::new();
        let mut hot = Vec::new();
        let mut split = QuietSplit {
            by_tenth: vec![Vec::new(); 10],
            ..QuietSplit::default()
        };
        let end = observed.sent.values().map(|s| s.committed_ms).max();
        let tenth = (end.unwrap_or(0).saturating_sub(observed.traffic_from) / 10).max(1);
        let fault_ends: Vec<(u128, u128)> =
            observed.faults.iter().map(|(_, to)| (*to, *to)).collect();
        for (sent, at, latency) in published_latencies(&observed.sent, published) {
            if sent.hot {
                hot.push(latency);
                continue;
            }
            if sent.key == HOT_KEY || faulty(sent.committed_ms) || faulty(at) {
                continue;
            }
            if within(&bursts, sent.committed_ms, 0, 0) {
                bursting.push(latency);
            } else {
                quiet.push(latency);
                let at = sent.committed_ms;
                let part = (at.saturating_sub(observed.traffic_from) / tenth).min(9) as usize;
                split.by_tenth[part].push(latency);
                match observed.xmin_held {
                    Some((from, to)) if (from..=to).contains(&at) => &mut split.xmin_held,
                    _ => &mut split.xmin_free,
                }
                .push(latency);
                if within(&fault_ends, at, 0, 10_000) {
                    &mut split.after_fault
                } else {
                    &mut split.far_from_faults
                }
                .push(latency);
            }
        }
        Self {
            quiet: percentiles(&mut quiet),
            bursting: percentiles(&mut bursting),
            hot_p99: percentiles(&mut hot).1,
            quiet_split: split,
        }
    }

    /// Table rows splitting the quiet latency (see [`Latency::quiet_split`]).
    pub(super) fn print_quiet_split(&mut self) {
        let split = &mut self.quiet_split;
        let tenths: Vec<String> = split
            .by_tenth
            .iter_mut()
            .map(|part| format!("{:.0}", percentiles(part).1))
            .collect();
        println!(
            "| other keys' quiet p99 by tenth of the run | {} ms |",
            tenths.join(" / ")
        );
        let pair = |a: &mut Vec<f64>, b: &mut Vec<f64>| {
            let (a, b) = (percentiles(a), percentiles(b));
            format!("{:.0} / {:.0} ms ({} / {} events)", a.1, b.1, a.2, b.2)
        };
        println!(
            "| other keys' quiet p99, xmin held / not | {} |",
            pair(&mut split.xmin_held, &mut split.xmin_free)
        );
        println!(
            "| other keys' quiet p99, within 10 s after a fault window / further | {} |",
            pair(&mut split.after_fault, &mut split.far_from_faults)
        );
    }
}
/// An event a soak committed, as the latency checks read it.
pub(crate) trait SentEvent {
    /// When its transaction committed (ms since the epoch).
    fn committed_ms(&self) -> u128;
    /// Whether it was part of a hot burst.
    fn hot(&self) -> bool;
}

impl SentEvent for super::Sent {
    fn committed_ms(&self) -> u128 {
        self.committed_ms
    }
    fn hot(&self) -> bool {
        self.hot
    }
}

/// Each event of `sent` that was published, with its publication time
/// and its commit→publish latency in ms.
pub(crate) fn published_latencies<'a, S: SentEvent>(
    sent: &'a HashMap<EventId, S>,
    published: &'a HashMap<String, u128>,
) -> impl Iterator<Item = (&'a S, u128, f64)> + 'a {
    sent.iter().filter_map(|(id, s)| {
        let at = *published.get(&id.to_string())?;
        Some((s, at, at.saturating_sub(s.committed_ms()) as f64))
    })
}

/// Prints the fairness rows of a soak's table: `others`' latency quiet
/// and while `hot` drains, and the hot bursts' own.
pub(crate) fn print_fairness(
    others: &str,
    hot: &str,
    quiet: (f64, f64, usize),
    bursting: (f64, f64, usize),
    hot_p99: f64,
) {
    for (when, (p50, p99, n)) in [("quiet", quiet), (&format!("while {hot} drains"), bursting)] {
        println!(
            "| {others}' commit→publish p50 / p99, {when} | {p50:.0} / {p99:.0} ms ({n} events) |"
        );
    }
    println!("| hot bursts' commit→publish p99 | {hot_p99:.0} ms |");
}

/// Whether `at` falls in one of `spans`, `(from, to)`, widened by
/// `before` and `after`.
pub(crate) fn within(spans: &[(u128, u128)], at: u128, before: u128, after: u128) -> bool {
    spans
        .iter()
        .any(|(from, to)| at + before >= *from && at <= to + after)
}

/// Each burst, `(first commit, last commit)`, as `(first commit, last
/// publication of its events)`: a burst drains until its last event is
/// published. `sent`: every event committed.
pub(crate) fn drained_bursts(
    bursts: &[(u128, u128)],
    sent: &HashMap<EventId, impl SentEvent>,
    published: &HashMap<String, u128>,
) -> Vec<(u128, u128)> {
    let hot: Vec<(u128, u128)> = sent
        .iter()
        .filter(|(_, s)| s.hot())
        .filter_map(|(id, s)| Some((s.committed_ms(), *published.get(&id.to_string())?)))
        .collect();
    bursts
        .iter()
        .map(|&(from, until)| {
            let drained = hot
                .iter()
                .filter(|(committed, _)| (from..=until).contains(committed))
                .map(|(_, published)| *published)
                .max()
                .unwrap_or(until);
            (from, drained)
        })
        .collect()
}

/// The fairness check of both soaks, on `(p50, p99, samples)` of the
/// others' commit→publish latency while a burst drains and otherwise:
/// what it finds broken, if anything. A side with almost no samples
/// measured nothing;
/// the others are held back when their p99 during bursts is well above
/// their p99 otherwise and above `beyond` too.
pub(crate) fn held_back(
    quiet: (f64, f64, usize),
    bursting: (f64, f64, usize),
    beyond: f64,
    others: &str,
    hot: &str,
) -> Option<String> {
    if quiet.2 < 1_000 || bursting.2 < 20 {
        return Some(format!(
            "only {} quiet samples of {others} and {} while {hot} drained: the fairness check measured nothing",
            quiet.2, bursting.2
        ));
    }
    let held = bursting.1 > 2.0 * quiet.1 + 250.0 && bursting.1 > beyond;
    held.then(|| {
        format!(
            "{others} waited {:.0} ms (p99) while {hot} drained, {:.0} ms otherwise",
            bursting.1, quiet.1
        )
    })
}

pub(crate) fn percentiles(values: &mut [f64]) -> (f64, f64, usize) {
    if values.is_empty() {
        return (0.0, 0.0, 0);
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), values.len())
}
/// The median probe claim of the run's first third and of its last third.
pub(super) fn claim_trend(claims: &[(Duration, f64)]) -> (f64, f64) {
    let Some(end) = claims.last().map(|(at, _)| *at) else {
        return (0.0, 0.0);
    };
    let median = |mut v: Vec<f64>| percentiles(&mut v).0;
    (
        median(
            claims
                .iter()
                .filter(|(at, _)| *at < end / 3)
                .map(|(_, ms)| *ms)
                .collect(),
        ),
        median(
            claims
                .iter()
                .filter(|(at, _)| *at > end * 2 / 3)
                .map(|(_, ms)| *ms)
                .collect(),
        ),
    )
}
