//! The soak's faults on the relays and the server: kills, pauses past the
//! lease, rolling deploys, and a report holding xmin.

use super::*;
use crate::run::Role;

/// Relay faults on their own clocks: a SIGKILL and restart, a pause past
/// the lease (SIGSTOP, then SIGCONT), a rolling redeploy (SIGTERM, drain,
/// restart, `migrate()` at start).
pub(super) async fn relay_faults(
    relays: Arc<Mutex<Vec<Role>>>,
    settings: Settings,
    observed: Arc<Mutex<Observed>>,
    done: CancellationToken,
) {
    let random = SplitMix64::from_entropy();
    let started = Instant::now();
    let (mut next_kill, mut next_pause, mut next_deploy) = (
        started + settings.kill_every,
        started + settings.pause_every,
        started + settings.deploy_every,
    );
    let pick = |n: usize| (random.next_unit() * n as f64) as usize % n;
    while !done.is_cancelled() {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = done.cancelled() => break,
        }
        let now = Instant::now();
        // A fault due while a burst drains waits for the burst.
        let may_begin = || observed.lock().expect("observed").begin_fault();
        if now >= next_kill && may_begin() {
            next_kill += settings.kill_every;
            let mut relays = relays.lock().expect("relays");
            let victim = pick(relays.len());
            let at = now_ms();
            relays[victim].kill_and_restart();
            let mut observed = observed.lock().expect("observed");
            observed.kills += 1;
            // The victim's keys wait for its lease to lapse: a fault
            // window, not the quiet latency the hot-key check compares to.
            observed.fault(at, LEASE + Duration::from_secs(1));
        }
        if now >= next_pause && may_begin() {
            next_pause += settings.pause_every;
            let victim = pick(4);
            let from = now_ms();
            relays.lock().expect("relays")[victim].pause(true);
            tokio::time::sleep(LEASE + Duration::from_secs(2)).await;
            relays.lock().expect("relays")[victim].pause(false);
            let mut observed = observed.lock().expect("observed");
            observed.pauses += 1;
            observed.fault(from, Duration::from_secs(1));
        }
        if now >= next_deploy && may_begin() {
            next_deploy += settings.deploy_every;
            let from = now_ms();
            for i in 0..4 {
                let relays = relays.clone();
                tokio::task::spawn_blocking(move || {
                    relays.lock().expect("relays")[i].terminate_and_restart(Duration::from_secs(5))
                })
                .await
                .expect("a deploy step");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let mut observed = observed.lock().expect("observed");
            observed.deploys += 1;
            observed.fault(from, settings.after_restart());
        }
    }
}
/// A report left open: a REPEATABLE READ transaction holding the server's
/// xmin for `xmin_held`, from a quarter into the run. On a thread of its
/// own with its own connection: a spawned future holding a sqlx transaction
/// across a `select!` trips rustc's "not general enough" limitation.
pub(super) fn hold_xmin(
    url: String,
    settings: Settings,
    observed: Arc<Mutex<Observed>>,
    done: CancellationToken,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async move {
                use sqlx::Connection;
                tokio::select! {
                    _ = tokio::time::sleep(settings.duration / 4) => {}
                    _ = done.cancelled() => return Ok(()),
                }
                let mut report = sqlx::PgConnection::connect(&url).await?;
                sqlx::raw_sql(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox_events",
                )
                .execute(&mut report)
                .await?;
                let from = now_ms();
                tokio::select! {
                    _ = tokio::time::sleep(settings.xmin_held) => {}
                    _ = done.cancelled() => {}
                }
                // A server restart may have ended it already.
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut report).await;
                observed.lock().expect("observed").xmin_held = Some((from, now_ms()));
                Ok(())
            })
    })
}
