//! One relay in a process of its own, as one replica of a service runs it:
//! the child side of [`crate::fleet`]. Nothing is shared with the other
//! relays but the database.
//!
//! Talks to its parent over stdio, one line each way:
//! * prints `ready` once connected, then waits for `go` on stdin;
//! * prints `delivered N` (its running total) after every publish call;
//! * stops gracefully when stdin closes, prints `stopped <published>
//!   <failed> <store errors>`, writes its publication log and exits.
//!
//! The log has one line per event delivered: `<CLOCK_MONOTONIC ns> <index
//! in its publish call> <sequence> <partition key>`. The monotonic clock is
//! the machine's, shared by every process on it, so the parent can merge
//! the logs into one timeline and check per-key order across relays.

use std::io::Write;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::event::StoredEvent;
use outbox_core::{
    CancellationToken, Ordering, PublishOutcome, Publisher, PublisherCapabilities, Relay,
    RelayConfig,
};
use tokio::io::AsyncBufReadExt;

use crate::env::{self, Error};

/// The subcommand that runs this side.
pub const SUBCOMMAND: &str = "relay-process";

/// What the parent passes on the command line.
pub struct Args {
    /// Lease owner name.
    pub relay_id: String,
    /// Events per claim.
    pub batch_size: usize,
    /// Per-key or unordered.
    pub ordering: Ordering,
    /// Where the publication log goes.
    pub log: std::path::PathBuf,
}

impl Args {
    /// The command-line form [`parse`](Self::parse) reads.
    pub fn to_command_line(&self) -> Vec<String> {
        vec![
            SUBCOMMAND.into(),
            self.relay_id.clone(),
            self.batch_size.to_string(),
            match self.ordering {
                Ordering::PerKey => "per-key".into(),
                Ordering::Unordered => "unordered".into(),
            },
            self.log.display().to_string(),
        ]
    }

    /// Reads the arguments after the subcommand.
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Self, Error> {
        let mut next = |what: &str| {
            args.next()
                .ok_or_else(|| format!("{SUBCOMMAND}: no {what}"))
        };
        Ok(Self {
            relay_id: next("relay id")?,
            batch_size: next("batch size")?.parse()?,
            ordering: match next("ordering")?.as_str() {
                "per-key" => Ordering::PerKey,
                "unordered" => Ordering::Unordered,
                other => return Err(format!("{SUBCOMMAND}: unknown ordering {other}").into()),
            },
            log: next("log path")?.into(),
        })
    }
}

/// The machine's monotonic clock in nanoseconds (`CLOCK_MONOTONIC`: one
/// clock for every process on the machine, unlike `Instant`'s origin).
pub fn monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// A no-op publisher that logs each delivery with the monotonic time of
/// its call and tells the parent its running total.
struct LoggingPublisher {
    max_batch: usize,
    log: Mutex<(u64, Vec<u8>)>,
}

#[async_trait]
impl Publisher for LoggingPublisher {
    fn capabilities(&self) -> PublisherCapabilities {
        PublisherCapabilities {
            max_batch: self.max_batch,
            preserves_key_order: true,
        }
    }

    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        let at = monotonic_ns();
        let total = {
            let mut log = self.log.lock().expect("log lock");
            for (index, event) in batch.iter().enumerate() {
                let _ = writeln!(
                    log.1,
                    "{at} {index} {} {}",
                    event.sequence, event.event.partition_key
                );
            }
            log.0 += batch.len() as u64;
            log.0
        };
        println!("delivered {total}");
        batch.iter().map(|_| Ok(())).collect()
    }
}

/// Runs the child side; the process's exit code.
pub async fn run(args: Args) -> Result<(), Error> {
    let pool = env::pg_bench_pool(4).await?;
    let store = Arc::new(env::pg_store_unmigrated(&pool)?);
    let publisher = Arc::new(LoggingPublisher {
        max_batch: args.batch_size,
        log: Mutex::new((0, Vec::new())),
    });
    let config = RelayConfig {
        relay_id: outbox_core::store::RelayId::new(args.relay_id.clone()),
        ..crate::relay_run::config(args.batch_size, args.ordering)
    };
    let relay = Relay::new(store, publisher.clone(), config)?;
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    println!("ready");
    match stdin.next_line().await? {
        Some(line) if line == "go" => {}
        other => return Err(format!("{SUBCOMMAND}: expected go, read {other:?}").into()),
    }
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        // Stdin closing (or anything more on it) is the parent saying stop.
        let _ = stdin.next_line().await;
        stop.cancel();
    });
    let report = relay.run(shutdown).await?;
    println!(
        "stopped {} {} {}",
        report.published, report.failed, report.store_errors
    );
    let log = std::mem::take(&mut publisher.log.lock().expect("log lock").1);
    std::fs::write(&args.log, log)?;
    pool.close().await;
    Ok(())
}
