//! The operators' dashboard (`outbox dashboard`, the binary beside this
//! one) over PostgreSQL with 1,000,000 events waiting: how long its
//! overview takes to render end to end (an HTTP GET of `/`), with the
//! planner's statistics from when the table was empty (stale) and fresh.
//! The dashboard reads the store's counts, relays, what holds publication
//! back and blocked keys in the background and renders pages from the
//! last read: `first` is a fresh dashboard's first page (it waits for that
//! read), `slowest` the slowest of the pages after it. The bound:
//! under 200 ms.

use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::Executor;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::{Rounds, Scale, progress};
use crate::env::{self, Error};
use crate::report::{Report, TargetCheck};
use crate::stats::percentiles;

/// Scenario name.
pub const NAME: &str = "dashboard-postgres";
/// Overview renders per measurement (after one to warm up).
const READS: usize = 5;
/// The bound on the slowest render, ms.
const BOUND_MS: f64 = 200.0;

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let waiting = scale.pick(1_000_000, 20_000);
    let pool = env::pg_pool(8).await?;
    let store = env::pg_store(&pool).await?;
    let mut rounds = Rounds::default();
    for round in 0..scale.rounds {
        env::pg_reset(&pool).await?;
        pool.execute(
            "ANALYZE bench_events; ALTER TABLE bench_events SET (autovacuum_enabled = false)",
        )
        .await?;
        let measured = async {
            env::fill_writer(&store, waiting, |i| env::event(round, i)).await?;
            let stale = Dashboard::start().await?.overviews().await?;
            pool.execute("ANALYZE bench_events").await?;
            let fresh = Dashboard::start().await?.overviews().await?;
            Ok::<_, Error>((stale, fresh))
        }
        .await;
        pool.execute("ALTER TABLE bench_events RESET (autovacuum_enabled)")
            .await?;
        let ((stale_first, stale), (fresh_first, fresh)) = measured?;
        rounds.add("overview-stale-stats", "first ms", stale_first, false);
        rounds.add("overview-stale-stats", "slowest ms", stale, false);
        rounds.add("overview-fresh-stats", "first ms", fresh_first, false);
        rounds.add("overview-fresh-stats", "slowest ms", fresh, false);
        progress(format!(
            "round {round} overview with {waiting} waiting: first {stale_first:.0} ms, then slowest {stale:.1} ms with stale statistics; {fresh_first:.0} ms, then {fresh:.1} ms fresh"
        ));
    }
    rounds.finish(NAME, report);
    for (contender, label) in [
        ("overview-stale-stats", "stale"),
        ("overview-fresh-stats", "fresh"),
    ] {
        let slowest = report
            .worst(NAME, contender, "slowest ms")
            .unwrap_or(f64::NAN);
        report.target(TargetCheck::at_most(
            format!(
                "dashboard overview ms with {waiting} waiting, {label} statistics (worst round)"
            ),
            slowest,
            BOUND_MS,
        ));
    }
    pool.close().await;
    Ok(())
}

/// `outbox dashboard` on the bench tables, killed on drop.
struct Dashboard {
    _child: tokio::process::Child,
    address: String,
}

impl Dashboard {
    async fn start() -> Result<Self, Error> {
        let binary = std::env::current_exe()?.with_file_name("outbox");
        if !binary.exists() {
            return Err(format!(
                "{} is missing: build it beside the bench (cargo build --release -p outbox-cli)",
                binary.display()
            )
            .into());
        }
        let mut child = tokio::process::Command::new(&binary)
            .args(["--url", &format!("{}/{}", env::pg_server(), env::DATABASE)])
            .args(["--prefix", "bench", "dashboard", "--listen", "127.0.0.1:0"])
            .args(["--sample-every", "10s"])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let first = tokio::time::timeout(
            Duration::from_secs(30),
            BufReader::new(stdout).lines().next_line(),
        )
        .await??
        .ok_or("the dashboard said nothing")?;
        let address = first
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .ok_or_else(|| format!("no address in {first:?}"))?
            .to_owned();
        Ok(Self {
            _child: child,
            address,
        })
    }

    /// The first overview's time, then the slowest of the [`READS`] after
    /// it, ms.
    async fn overviews(&self) -> Result<(f64, f64), Error> {
        let started = Instant::now();
        self.overview().await?;
        let first = started.elapsed().as_secs_f64() * 1_000.0;
        let mut times = Vec::with_capacity(READS);
        for _ in 0..READS {
            let started = Instant::now();
            self.overview().await?;
            times.push(started.elapsed().as_secs_f64() * 1_000.0);
        }
        Ok((first, percentiles(&mut times, &[100.0])[0]))
    }

    async fn overview(&self) -> Result<(), Error> {
        let mut socket = tokio::net::TcpStream::connect(&self.address).await?;
        socket
            .write_all(
                format!(
                    "GET / HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n",
                    self.address
                )
                .as_bytes(),
            )
            .await?;
        let mut page = Vec::new();
        socket.read_to_end(&mut page).await?;
        let page = String::from_utf8_lossy(&page);
        if !page.starts_with("HTTP/1.1 200") || !page.contains("data-state=\"claimable\"") {
            return Err(format!(
                "the overview did not render: {}",
                &page[..page.len().min(300)]
            )
            .into());
        }
        Ok(())
    }
}
