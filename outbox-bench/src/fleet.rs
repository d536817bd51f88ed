//! Several relays in separate OS processes (this binary again, as
//! [`crate::relay_process`]), draining one PostgreSQL
//! outbox with no coordinator but the database: how N replicas of a
//! service would run them.
//!
//! The drain is timed from `go` to the last relay stopped, after every
//! event was delivered. Then the relays' publication logs are merged on the
//! machine's monotonic clock and checked: every event published exactly
//! once, and each key's events in sequence order across all relays (a
//! key's next batch is claimed only after its previous one was settled, so
//! on one clock its publish calls never overlap).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use outbox_core::Ordering;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;

use crate::env::Error;
use crate::relay_process::{self, Args};

/// How long a fleet's drain may take before the harness calls events lost.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// One relay process and what it said.
struct Member {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    log: PathBuf,
}

/// Runs `relays` relay processes over the bench outbox (filled, `expected`
/// events) until every event is delivered, stops them and checks the
/// publication. Returns the drain's time.
pub async fn drain(
    relays: usize,
    batch_size: usize,
    ordering: Ordering,
    expected: u64,
    log_dir: &Path,
) -> Result<Duration, Error> {
    std::fs::create_dir_all(log_dir)?;
    let delivered: Arc<Vec<AtomicU64>> = Arc::new((0..relays).map(|_| AtomicU64::new(0)).collect());
    let progress = Arc::new(Notify::new());
    let mut members = Vec::with_capacity(relays);
    for i in 0..relays {
        let log = log_dir.join(format!("relay-{i}.log"));
        let _ = std::fs::remove_file(&log);
        let args = Args {
            relay_id: format!("fleet-{i}"),
            batch_size,
            ordering,
            log: log.clone(),
        };
        members.push(spawn(&args, i, delivered.clone(), progress.clone())?);
    }
    for member in &mut members {
        expect_line(member, "ready").await?;
    }
    let started = Instant::now();
    for member in &mut members {
        let stdin = member.stdin.as_mut().expect("stdin until stopped");
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
    }
    let total = || {
        delivered
            .iter()
            .map(|d| d.load(AtomicOrdering::SeqCst))
            .sum::<u64>()
    };
    let reached = tokio::time::timeout(DRAIN_LIMIT, async {
        loop {
            let notified = progress.notified();
            if total() >= expected {
                return;
            }
            notified.await;
        }
    })
    .await;
    // Closing stdin stops each relay gracefully.
    for member in &mut members {
        member.stdin.take();
    }
    let mut reports = Vec::with_capacity(relays);
    for member in &mut members {
        reports.push(expect_line(member, "stopped").await?);
    }
    let elapsed = started.elapsed();
    for member in &mut members {
        let status = member.child.wait().await?;
        if !status.success() {
            return Err(format!("a relay process exited with {status}").into());
        }
    }
    if reached.is_err() {
        return Err(format!(
            "only {} of {expected} events delivered within {DRAIN_LIMIT:?} by {relays} relay processes",
            total()
        )
        .into());
    }
    for report in &reports {
        // "<published> <failed> <store errors>"
        let failed = report.split_whitespace().nth(1).unwrap_or("?");
        if failed != "0" {
            return Err(format!("a relay process reports failures: {report}").into());
        }
    }
    check_publication(
        &members.iter().map(|m| m.log.clone()).collect::<Vec<_>>(),
        expected,
        ordering,
    )?;
    Ok(elapsed)
}

fn spawn(
    args: &Args,
    index: usize,
    delivered: Arc<Vec<AtomicU64>>,
    progress: Arc<Notify>,
) -> Result<Member, Error> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(args.to_command_line())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines_tx, lines) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stdout = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = stdout.next_line().await {
            if let Some(n) = line.strip_prefix("delivered ") {
                if let Ok(n) = n.parse() {
                    delivered[index].store(n, AtomicOrdering::SeqCst);
                    progress.notify_waiters();
                }
            } else if lines_tx.send(line).is_err() {
                break;
            }
        }
        // The process is gone: wake the waiter, which then finds the total
        // short and times out, or sees the exit status.
        progress.notify_waiters();
    });
    Ok(Member {
        child,
        stdin,
        lines,
        log: args.log.clone(),
    })
}

/// Waits for the member's next line starting with `word`; returns the rest.
async fn expect_line(member: &mut Member, word: &str) -> Result<String, Error> {
    let line = tokio::time::timeout(DRAIN_LIMIT, member.lines.recv())
        .await
        .map_err(|_| {
            format!(
                "{} said nothing within {DRAIN_LIMIT:?}",
                relay_process::SUBCOMMAND
            )
        })?
        .ok_or_else(|| format!("a relay process ended before saying {word}"))?;
    line.strip_prefix(word)
        .map(|rest| rest.trim().to_string())
        .ok_or_else(|| format!("a relay process said {line:?}, expected {word}").into())
}

/// One delivery in a relay's log.
struct Delivery {
    at_ns: u64,
    index: u32,
    relay: usize,
    sequence: i64,
    key: String,
}

/// Every event delivered exactly once; with per-key order, each key's
/// sequences increase along the merged timeline.
fn check_publication(logs: &[PathBuf], expected: u64, ordering: Ordering) -> Result<(), Error> {
    let mut deliveries = Vec::with_capacity(expected as usize);
    for (relay, log) in logs.iter().enumerate() {
        let text = std::fs::read_to_string(log)?;
        for line in text.lines() {
            let mut fields = line.splitn(4, ' ');
            let mut field = || {
                fields
                    .next()
                    .ok_or_else(|| format!("short log line {line:?}"))
            };
            deliveries.push(Delivery {
                at_ns: field()?.parse()?,
                index: field()?.parse()?,
                relay,
                sequence: field()?.parse()?,
                key: field()?.to_string(),
            });
        }
    }
    let mut seen = std::collections::HashSet::with_capacity(deliveries.len());
    let duplicates = deliveries
        .iter()
        .filter(|d| !seen.insert(d.sequence))
        .count();
    if duplicates != 0 || seen.len() as u64 != expected {
        return Err(format!(
            "{} distinct events of {expected} delivered, {duplicates} duplicates",
            seen.len()
        )
        .into());
    }
    if ordering == Ordering::Unordered {
        return Ok(());
    }
    deliveries.sort_by_key(|d| (d.at_ns, d.relay, d.index));
    let mut last: HashMap<&str, (i64, usize)> = HashMap::new();
    for d in &deliveries {
        if let Some((previous, relay)) = last.insert(&d.key, (d.sequence, d.relay))
            && previous >= d.sequence
        {
            return Err(format!(
                "key {} out of order: sequence {} (relay {relay}) before {} (relay {})",
                d.key, previous, d.sequence, d.relay
            )
            .into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_log(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    }

    #[test]
    fn a_key_published_out_of_order_across_relays_is_caught() {
        let dir = std::env::temp_dir().join(format!("fleet-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = write_log(&dir, "a", &["100 0 1 k", "300 0 4 k"]);
        let in_order = write_log(&dir, "b", &["200 0 2 k", "200 1 3 k"]);
        check_publication(&[a.clone(), in_order], 4, Ordering::PerKey).unwrap();
        let late = write_log(&dir, "c", &["400 0 2 k", "400 1 3 k"]);
        let error = check_publication(&[a.clone(), late.clone()], 4, Ordering::PerKey).unwrap_err();
        assert!(error.to_string().contains("out of order"), "{error}");
        // Unordered drains only need each event once.
        check_publication(&[a, late], 4, Ordering::Unordered).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_lost_or_doubled_event_is_caught() {
        let dir = std::env::temp_dir().join(format!("fleet-count-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = write_log(&dir, "a", &["100 0 1 k", "200 0 2 j"]);
        let error = check_publication(std::slice::from_ref(&a), 3, Ordering::PerKey).unwrap_err();
        assert!(
            error.to_string().contains("2 distinct events of 3"),
            "{error}"
        );
        let again = write_log(&dir, "b", &["300 0 2 j"]);
        let error = check_publication(&[a, again], 2, Ordering::PerKey).unwrap_err();
        assert!(error.to_string().contains("1 duplicates"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
