//! The tenants soak's end: every event published, then what the run saw,
//! as a table and as the checks that fail it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::daemon::Daemon;
use super::{Observed, Settings};
use crate::Error;
use crate::soak::{
    SentEvent, drained_bursts, first_publications, held_back, percentiles, print_fairness,
    published_latencies, within,
};

/// Commit→publish of the other tenants' events, outside redeploys and a
/// new tenant's first seconds: quiet, while a hot burst drains, and in the
/// run's first and last thirds; and the hot events' p99.
struct Latency {
    quiet: (f64, f64, usize),
    bursting: (f64, f64, usize),
    first_third_p50: f64,
    last_third_p50: f64,
    hot_p99: f64,
}

impl SentEvent for super::Sent {
    fn committed_ms(&self) -> u128 {
        self.committed_ms
    }
    fn hot(&self) -> bool {
        self.hot
    }
}

impl Latency {
    fn of(observed: &Observed, published: &HashMap<String, u128>, joining: u128) -> Self {
        let bursts = drained_bursts(&observed.bursts, &observed.sent, published);
        let redeploying = |at: u128| within(&observed.deploys, at, 500, 5_000);
        let (start, end) = observed.sent.values().fold((u128::MAX, 0), |(lo, hi), s| {
            (lo.min(s.committed_ms), hi.max(s.committed_ms))
        });
        let third = (end.saturating_sub(start)) / 3;
        let (mut quiet, mut bursting, mut hot) = (Vec::new(), Vec::new(), Vec::new());
        let (mut first, mut last) = (Vec::new(), Vec::new());
        for (sent, at, latency) in published_latencies(&observed.sent, published) {
            if sent.hot {
                hot.push(latency);
                continue;
            }
            let new_tenant = observed
                .joined
                .get(&sent.tenant)
                .is_some_and(|joined| sent.committed_ms < joined + joining);
            if new_tenant || redeploying(sent.committed_ms) || redeploying(at) {
                continue;
            }
            if within(&bursts, sent.committed_ms, 0, 0) {
                bursting.push(latency);
                continue;
            }
            quiet.push(latency);
            if sent.committed_ms < start + third {
                first.push(latency);
            } else if sent.committed_ms > end - third {
                last.push(latency);
            }
        }
        Self {
            quiet: percentiles(&mut quiet),
            bursting: percentiles(&mut bursting),
            first_third_p50: percentiles(&mut first).0,
            last_third_p50: percentiles(&mut last).0,
            hot_p99: percentiles(&mut hot).1,
        }
    }
}

/// Waits until every committed event is published (at most 2 minutes),
/// prints the table and fails on any broken promise.
pub(super) async fn settle_and_check(
    settings: &Settings,
    daemon: &Daemon,
    redis: &str,
    pool: &sqlx::PgPool,
    observed: &Mutex<Observed>,
) -> Result<(), Error> {
    let observed = std::mem::take(&mut *observed.lock().expect("observed"));
    let drain_started = Instant::now();
    let mut published = first_publications(redis).await?;
    while drain_started.elapsed() < Duration::from_secs(120)
        && observed
            .sent
            .keys()
            .any(|id| !published.contains_key(&id.to_string()))
    {
        tokio::time::sleep(Duration::from_secs(2)).await;
        published = first_publications(redis).await?;
    }
    let lost = observed
        .sent
        .keys()
        .filter(|id| !published.contains_key(&id.to_string()))
        .count();
    let all_running = daemon
        .until_all_running(pool, Duration::from_secs(30))
        .await;

    // A tenant made while running starts at the daemon's next refresh (1 s).
    let joining = 3_000;
    let latency = Latency::of(&observed, &published, joining);
    let mut slowest_start = 0u128;
    for tenant in observed.joined.keys() {
        let of_tenant = observed.sent.iter().filter(|(_, s)| &s.tenant == tenant);
        let first_commit = of_tenant.clone().map(|(_, s)| s.committed_ms).min();
        let first_publish = of_tenant
            .filter_map(|(id, _)| published.get(&id.to_string()))
            .min();
        if let (Some(c), Some(p)) = (first_commit, first_publish) {
            slowest_start = slowest_start.max(p.saturating_sub(c));
        }
    }
    let samples = &observed.samples;
    let (start, end) = (
        samples.first().map_or(0, |s| s.at_ms),
        samples.last().map_or(0, |s| s.at_ms),
    );
    let third = end.saturating_sub(start) / 3;
    let rss_max = |keep: &dyn Fn(u128) -> bool| {
        samples
            .iter()
            .filter(|s| keep(s.at_ms))
            .filter_map(|s| s.rss_mib)
            .fold(0.0, f64::max)
    };
    let rss_early = rss_max(&|at| at < start + third);
    let rss_late = rss_max(&|at| at > end - third);
    let connections_max = samples.iter().map(|s| s.connections).max().unwrap_or(0);
    // Rows beyond what the retention window (plus two purge rounds and a
    // redeploy's pause) may keep: everything committed within it.
    let window =
        (settings.retention + settings.purge_every * 2 + Duration::from_secs(10)).as_millis();
    let mut history_excess = 0i64;
    for sample in samples {
        let Some(rows) = sample.rows else { continue };
        let kept = observed
            .sent
            .values()
            .filter(|s| s.committed_ms + window > sample.at_ms)
            .count() as i64;
        history_excess = history_excess.max(rows - kept);
    }

    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| events committed (hot bursts among them) / lost | {} ({}) / {lost} |",
        observed.sent.len(),
        observed.sent.values().filter(|s| s.hot).count()
    );
    println!(
        "| tenants created / dropped while running (drops retried after a deadlock); redeploys | {} / {} ({}); {} |",
        observed.joined.len(),
        observed.dropped,
        observed.drops_retried,
        observed.deploys.len()
    );
    println!(
        "| a new tenant's first publication after its first commit, slowest | {slowest_start} ms |"
    );
    print_fairness(
        "other tenants",
        "the hot tenant",
        latency.quiet,
        latency.bursting,
        latency.hot_p99,
    );
    println!(
        "| quiet p50, first third / last third of the run | {:.0} / {:.0} ms |",
        latency.first_third_p50, latency.last_third_p50
    );
    println!(
        "| daemon memory, most in the first third / last third | {rss_early:.1} / {rss_late:.1} MiB |"
    );
    println!(
        "| daemon connections, most seen (bound {}) | {connections_max} |",
        settings.connections
    );
    println!(
        "| rows beyond the retention window, most seen | {} |",
        history_excess.max(0)
    );
    println!(
        "| every tenant running at the end (/health) | {} |",
        all_running.is_ok()
    );

    let mut broken = Vec::new();
    if lost > 0 {
        broken.push(format!("{lost} events never published"));
    }
    if let Err(health) = &all_running {
        broken.push(format!(
            "/health did not count every tenant running: {health}"
        ));
    }
    if observed.joined.is_empty() || observed.dropped == 0 || observed.deploys.is_empty() {
        broken.push(
            "no tenant was created, dropped or redeployed: the churn checks measured nothing"
                .into(),
        );
    }
    if slowest_start > 10_000 {
        broken.push(format!(
            "a new tenant waited {slowest_start} ms for its first publication"
        ));
    }
    broken.extend(held_back(
        latency.quiet,
        latency.bursting,
        0.0,
        "other tenants",
        "the hot tenant",
    ));
    if latency.last_third_p50 > 2.0 * latency.first_third_p50 + 25.0 {
        broken.push(format!(
            "quiet latency rose from {:.0} to {:.0} ms (p50) over the run",
            latency.first_third_p50, latency.last_third_p50
        ));
    }
    if rss_late > rss_early * 1.25 + 8.0 {
        broken.push(format!(
            "the daemon's memory grew from {rss_early:.1} to {rss_late:.1} MiB"
        ));
    }
    if connections_max > i64::from(settings.connections) {
        broken.push(format!(
            "the daemon held {connections_max} connections (bound {})",
            settings.connections
        ));
    }
    if history_excess > 100 {
        broken.push(format!(
            "{history_excess} rows outlived the retention window"
        ));
    }
    if broken.is_empty() {
        println!("\ntenants soak: nothing lost, no tenant held another, nothing grew");
        Ok(())
    } else {
        Err(format!("tenants soak: {}", broken.join("; ")).into())
    }
}
