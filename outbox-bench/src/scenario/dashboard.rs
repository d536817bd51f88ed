//! The operators' dashboard (`outbox dashboard`, the binary beside this
//! one) over PostgreSQL with 1,000,000 events waiting: how long its
//! overview takes to render end to end (an HTTP GET of `/`), with the
//! planner's statistics from when the table was empty (stale) and fresh.
//! The dashboard reads the store's counts, relays, what holds publication
//! back and blocked keys in the background and renders pages from the
//! last read: `first` is a fresh dashboard's first page (it waits for that
//! read), `slowest` the slowest of the pages after it. The bound:
//! under 200 ms.
//!
//! Then the same events all failed (a million failed rows, each with its
//! history, written in SQL as a relay would leave them): a fresh
//! dashboard's first overview and the pages after it, the failed list's
//! first page, a page from the middle, one type of a thousandth of them, one
//! key of a ten-thousandth, an error text in every 997th, each the slowest
//! of [`READS`] GETs, under the same bound. Then bulk actions as an
//! operator starts them (signed in, through the forms): the confirmation's
//! count of every failed event, and a bulk requeue of the rare type, timed
//! from the confirmation until its page says it finished.

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
        let middle = fail_everything(&pool).await?;
        let dashboard = Dashboard::start().await?;
        let (failed_first, failed_slowest) = dashboard.overviews().await?;
        rounds.add("overview-all-failed", "first ms", failed_first, false);
        rounds.add("overview-all-failed", "slowest ms", failed_slowest, false);
        let signed_in = dashboard.sign_in().await?;
        for (contender, path) in failed_pages(middle) {
            let slowest = dashboard.slowest(&path, "id=\"matching\"").await?;
            rounds.add(contender, "slowest ms", slowest, false);
            progress(format!(
                "round {round} {path} with {waiting} failed: slowest {slowest:.1} ms"
            ));
        }
        let (count_ms, counted) = dashboard.confirm(&signed_in, "").await?;
        rounds.add("bulk-count-all-failed", "confirm ms", count_ms, false);
        let (rare_ms, rare) = dashboard.confirm(&signed_in, "type=refund.issued").await?;
        let started = Instant::now();
        let done = dashboard
            .run_bulk(&signed_in, "type=refund.issued", &rare)
            .await?;
        let rate = done as f64 / started.elapsed().as_secs_f64();
        rounds.add("bulk-requeue-rare-type", "confirm ms", rare_ms, false);
        rounds.add("bulk-requeue-rare-type", "requeued/s", rate, true);
        progress(format!(
            "round {round} bulk: counting {} took {count_ms:.0} ms; {done} of type refund.issued requeued at {rate:.0}/s",
            counted.count
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
    for (contender, _) in failed_pages(0) {
        let slowest = report
            .worst(NAME, contender, "slowest ms")
            .unwrap_or(f64::NAN);
        report.target(TargetCheck::at_most(
            format!("dashboard {contender} ms with {waiting} failed (worst round)"),
            slowest,
            BOUND_MS,
        ));
    }
    pool.close().await;
    Ok(())
}

/// The failed-list pages measured, by contender name (`middle`: the
/// sequence the middle page starts after).
fn failed_pages(middle: i64) -> [(&'static str, String); 5] {
    [
        ("failed-first-page", "/failed".into()),
        ("failed-middle-page", format!("/failed?after={middle}")),
        ("failed-rare-type", "/failed?type=refund.issued".into()),
        ("failed-one-key", "/failed?key=sub-7".into()),
        ("failed-error-text", "/failed?error=timed+out".into()),
    ]
}

/// Marks every event failed, as a relay leaves an event whose attempts ran
/// out: status, attempts, and a history row saying why. One in a thousand
/// becomes a `refund.issued`, one in 997 timed out. Returns the sequence
/// in the middle.
async fn fail_everything(pool: &sqlx::PgPool) -> Result<i64, Error> {
    pool.execute(
        "UPDATE bench_events SET status = 3, attempts = 5,
             event_type = CASE WHEN sequence % 1000 = 7 THEN 'refund.issued' ELSE event_type END;
         INSERT INTO bench_attempts (event_id, kind, at, actor, error_class, detail, attempts)
         SELECT event_id, 'AttemptsExhausted', now() - interval '1 hour', 'bench-relay', 'transient',
                CASE WHEN sequence % 997 = 0 THEN 'billing: connection timed out'
                     ELSE 'billing: HTTP 500 Internal Server Error' END, 5
         FROM bench_events;
         ANALYZE bench_events; ANALYZE bench_attempts",
    )
    .await?;
    let middle: i64 =
        sqlx::query_scalar("SELECT (min(sequence) + max(sequence)) / 2 FROM bench_events")
            .fetch_one(pool)
            .await?;
    Ok(middle)
}

/// The token the bench signs in with.
const TOKEN: &str = "bench-dashboard-token";

/// A signed-in session: its cookie and CSRF token.
struct SignedIn {
    cookie: String,
    csrf: String,
}

/// What a bulk action's confirmation counted.
struct Counted {
    count: u64,
    through: String,
}

/// The value of `attribute="…"` after `marker` in `page`.
fn attribute<'p>(page: &'p str, marker: &str, attribute: &str) -> Option<&'p str> {
    let rest = &page[page.find(marker)?..];
    let start = rest.find(&format!("{attribute}=\""))? + attribute.len() + 2;
    rest[start..].split('"').next()
}

/// `outbox dashboard` on the bench tables, killed on drop.
struct Dashboard {
    _child: tokio::process::Child,
    address: String,
}

impl Dashboard {
    async fn start() -> Result<Self, Error> {
        let binary = env::outbox_binary()?;
        let mut child = tokio::process::Command::new(&binary)
            .args(["--url", &format!("{}/{}", env::pg_server(), env::DATABASE)])
            .args(["--prefix", "bench", "dashboard", "--listen", "127.0.0.1:0"])
            .args(["--sample-every", "10s"])
            .env("OUTBOX_DASHBOARD_TOKEN", TOKEN)
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
        self.get("/", "data-state=\"claimable\"").await
    }

    /// The slowest of [`READS`] GETs of `path` (after one to warm up), ms.
    async fn slowest(&self, path: &str, expect: &str) -> Result<f64, Error> {
        self.get(path, expect).await?;
        let mut times = Vec::with_capacity(READS);
        for _ in 0..READS {
            let started = Instant::now();
            self.get(path, expect).await?;
            times.push(started.elapsed().as_secs_f64() * 1_000.0);
        }
        Ok(percentiles(&mut times, &[100.0])[0])
    }

    /// GETs `path`; an error unless it answers 200 with `expect` in it.
    async fn get(&self, path: &str, expect: &str) -> Result<(), Error> {
        let page = self.exchange("GET", path, "", "").await?;
        if !page.starts_with("HTTP/1.1 200") || !page.contains(expect) {
            return Err(format!("{path} did not render: {}", &page[..page.len().min(300)]).into());
        }
        Ok(())
    }

    /// Signs in with [`TOKEN`]; the session's cookie and CSRF token.
    async fn sign_in(&self) -> Result<SignedIn, Error> {
        let answer = self
            .exchange("POST", "/login", "", &format!("token={TOKEN}"))
            .await?;
        let cookie = answer
            .lines()
            .find_map(|line| line.strip_prefix("set-cookie: "))
            .and_then(|value| value.split(';').next())
            .ok_or_else(|| format!("no session cookie: {}", &answer[..answer.len().min(300)]))?
            .to_owned();
        let page = self
            .exchange("GET", "/failed", &format!("cookie: {cookie}\r\n"), "")
            .await?;
        let csrf = attribute(&page, "name=\"csrf\"", "value")
            .ok_or("no CSRF token on the failed events' page")?
            .to_owned();
        Ok(SignedIn { cookie, csrf })
    }

    /// A bulk requeue of what `filter` (a form-encoded filter) matches,
    /// up to its confirmation: how long the count took, and what it said.
    async fn confirm(&self, session: &SignedIn, filter: &str) -> Result<(f64, Counted), Error> {
        let started = Instant::now();
        let page = self.bulk(session, filter, "").await?;
        let took = started.elapsed().as_secs_f64() * 1_000.0;
        let count = attribute(&page, "id=\"confirm-count\"", "data-count")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("no count: {}", &page[..page.len().min(300)]))?;
        let through = attribute(&page, "name=\"through\"", "value")
            .unwrap_or_default()
            .to_owned();
        Ok((took, Counted { count, through }))
    }

    /// Confirms the bulk requeue `counted` and waits until its page says
    /// it finished; how many it requeued.
    async fn run_bulk(
        &self,
        session: &SignedIn,
        filter: &str,
        counted: &Counted,
    ) -> Result<u64, Error> {
        let confirmed = format!(
            "confirm=yes&count={}&through={}",
            counted.count, counted.through
        );
        let answer = self.bulk(session, filter, &confirmed).await?;
        let job = answer
            .lines()
            .find_map(|line| line.strip_prefix("location: "))
            .ok_or_else(|| format!("no job: {}", &answer[..answer.len().min(300)]))?
            .trim()
            .to_owned();
        let cookie = format!("cookie: {}\r\n", session.cookie);
        loop {
            let page = self.exchange("GET", &job, &cookie, "").await?;
            if attribute(&page, "id=\"bulk-progress\"", "data-state") == Some("finished") {
                let done = attribute(&page, "id=\"bulk-progress\"", "data-done");
                return Ok(done.and_then(|n| n.parse().ok()).unwrap_or(0));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn bulk(&self, session: &SignedIn, filter: &str, more: &str) -> Result<String, Error> {
        let form = format!(
            "csrf={}&action=requeue&operator=bench&reason=measured&{filter}&{more}",
            session.csrf
        );
        let cookie = format!("cookie: {}\r\n", session.cookie);
        self.exchange("POST", "/failed/bulk", &cookie, &form).await
    }

    /// One request (a form POST when `body` is not empty); the answer,
    /// head and body.
    async fn exchange(
        &self,
        method: &str,
        path: &str,
        headers: &str,
        body: &str,
    ) -> Result<String, Error> {
        let mut socket = tokio::net::TcpStream::connect(&self.address).await?;
        let form = if body.is_empty() {
            String::new()
        } else {
            format!(
                "content-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\n",
                body.len()
            )
        };
        socket
            .write_all(
                format!(
                    "{method} {path} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n{headers}{form}\r\n{body}",
                    self.address
                )
                .as_bytes(),
            )
            .await?;
        let mut page = Vec::new();
        socket.read_to_end(&mut page).await?;
        Ok(String::from_utf8_lossy(&page).into_owned())
    }
}
