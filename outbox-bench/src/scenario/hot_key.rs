//! What a hot key's backlog costs the other keys (PostgreSQL): four relays
//! with per-key order over a key-order publisher (1 ms a publish call, a
//! broker's round trip), an open-loop producer of 1,000 events/s over
//! 1,000 keys; in the `hot-burst` round a backlog of 100,000 events on one
//! key is committed as the producer starts (transactions of 1,000). The
//! other keys' commit → publish latency over the burst's drain is compared
//! with the same producer and no burst (`quiet`): per-key order must cost
//! only the hot key, so the other keys' p99 stays within 1.5x. A third
//! contender, `burst-elsewhere`, commits the same burst into another outbox
//! table no relay reads: the inserts' load on the machine without the
//! backlog, to tell the two apart while the burst is being committed. A
//! fourth, `burst-apart`, commits the same burst on one key into that other
//! outbox and drains it there with a relay of its own: the same inserts,
//! claims, decoding and publishing on the machine (two cores hold the
//! database, the producers and the relays), but nothing shared with the
//! other keys' outbox; `hot-burst` against it is what sharing the outbox
//! with the hot key costs the others.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::{CancellationToken, EventId, NewEvent, Relay, RelayConfig, RelayId};
use outbox_sqlx::postgres::PgStore;
use outbox_sqlx::{StoreConfig, TableNames};

use super::{Rounds, Scale, progress};
use crate::counting::{CountingPublisher, KeyOrderBroker};
use crate::env::{self, Error};
use crate::open_loop::open_loop;
use crate::report::{Report, TargetCheck};
use crate::stats::percentiles;

/// Scenario name.
pub const NAME: &str = "hot-key-postgres";
/// Events per second the other keys' producer offers.
const RATE: u64 = 1_000;
/// Relays side by side (one process, one pool).
const RELAYS: usize = 4;
/// Events per transaction of the burst.
const BURST_CHUNK: usize = 1_000;
/// The hot key.
const HOT_KEY: &str = "hot";
/// Where `burst-elsewhere` commits its burst: tables no relay reads.
const ELSEWHERE: &str = "bench_elsewhere";

/// Where a round's burst goes.
#[derive(Clone, Copy, PartialEq)]
enum Burst {
    None,
    /// On the hot key of the relayed outbox.
    Relayed,
    /// Into the outbox no relay reads.
    Elsewhere,
    /// Into the other outbox, drained there by a relay of its own.
    Apart,
}

/// Runs the scenario.
pub async fn run(scale: Scale, report: &mut Report) -> Result<(), Error> {
    let seconds = scale.pick(12, 3) as u64;
    let burst = scale.pick(100_000, 3_000);
    let pool = env::pg_pool(48).await?;
    let store = Arc::new(env::pg_store(&pool).await?);
    let elsewhere = PgStore::new(
        pool.clone(),
        StoreConfig::with_tables(TableNames::with_prefix(ELSEWHERE)?),
    );
    elsewhere.migrate().await?;
    let elsewhere = Arc::new(elsewhere);
    // The relays' first claims (connections, plans) are a start-up cost.
    env::pg_reset(&pool).await?;
    round(&store, &elsewhere, usize::MAX, (Burst::None, 0), 1).await?;
    let mut rounds = Rounds::default();
    for r in 0..scale.rounds {
        for (contender, kind) in [
            ("quiet", Burst::None),
            ("hot-burst", Burst::Relayed),
            ("burst-elsewhere", Burst::Elsewhere),
            ("burst-apart", Burst::Apart),
        ] {
            if !scale.includes(contender) {
                continue;
            }
            env::pg_reset(&pool).await?;
            env::pg_reset_tables(&pool, ELSEWHERE).await?;
            let hot = if kind == Burst::None { 0 } else { burst };
            let measured = round(&store, &elsewhere, r, (kind, hot), seconds).await?;
            record(&mut rounds, r, contender, kind, measured);
        }
    }
    rounds.finish(NAME, report);
    let m = |c: &str, metric: &str| report.median(NAME, c, metric).unwrap_or(f64::NAN);
    let overall = m("hot-burst", "others p99 ms") / m("quiet", "others p99 ms");
    let committing = m("hot-burst", COMMITTING) / m("burst-elsewhere", COMMITTING);
    let apart = m("hot-burst", "others p99 ms") / m("burst-apart", "others p99 ms");
    report.target(TargetCheck::at_most(
        format!("hot key: other keys' p99 during a {burst}-event burst / none"),
        overall,
        1.5,
    ));
    report.target(TargetCheck::at_most(
        format!("hot key: others' p99 while a {burst}-event burst commits / inserts elsewhere"),
        committing,
        1.5,
    ));
    report.target(TargetCheck::at_most(
        format!("hot key: others' p99 beside a {burst}-event burst in their outbox / in its own"),
        apart,
        1.5,
    ));
    pool.close().await;
    Ok(())
}

/// Others' p99 among the events committed while the burst was committed.
const COMMITTING: &str = "others p99 ms, burst committing";

fn record(rounds: &mut Rounds, r: usize, contender: &str, kind: Burst, measured: Measured) {
    let mut others = measured.others;
    let p = percentiles(&mut others, &[50.0, 99.0, 100.0]);
    let mut line = format!(
        "round {r} {contender}: other keys p50 {:.1} ms, p99 {:.1} ms ({} events)",
        p[0],
        p[1],
        others.len()
    );
    if kind != Burst::Elsewhere {
        rounds.add(contender, "others p50 ms", p[0], false);
        rounds.add(contender, "others p99 ms", p[1], false);
        rounds.add(contender, "others max ms", p[2], false);
    }
    let mut during = measured.others_during_commits;
    if kind != Burst::None && !during.is_empty() {
        let p99 = percentiles(&mut during, &[99.0])[0];
        rounds.add(contender, COMMITTING, p99, false);
        line += &format!(
            "; p99 {p99:.1} ms while the burst commits ({} events)",
            during.len()
        );
    }
    let mut after = measured.others_after_commits;
    if matches!(kind, Burst::Relayed | Burst::Apart) && !after.is_empty() {
        let p99 = percentiles(&mut after, &[99.0])[0];
        rounds.add(contender, "others p99 ms, burst committed", p99, false);
        rounds.add(contender, "burst drain s", measured.hot_drain, false);
        line += &format!(
            "; p99 {p99:.1} ms once committed ({} events); burst drained in {:.1} s",
            after.len(),
            measured.hot_drain
        );
    }
    progress(line);
}

/// One round's figures.
struct Measured {
    /// The other keys' commit → publish times (ms) of events committed
    /// while the hot key's backlog drained (all of them without a burst).
    others: Vec<f64>,
    /// Those of them committed before the burst's last commit: beside its
    /// inserts.
    others_during_commits: Vec<f64>,
    /// Those committed after the burst's last commit: the cost of the
    /// backlog alone, without the burst's inserts beside them.
    others_after_commits: Vec<f64>,
    /// Seconds from the burst's first commit to its last event published.
    hot_drain: f64,
}

/// Four relays; `hot` events on the hot key committed at the start; the
/// other keys at `RATE` for `seconds`.
async fn round(
    store: &Arc<PgStore>,
    elsewhere: &Arc<PgStore>,
    round: usize,
    (kind, hot): (Burst, usize),
    seconds: u64,
) -> Result<Measured, Error> {
    let publisher = Arc::new(
        CountingPublisher::wrapping(
            KeyOrderBroker {
                round_trip: Duration::from_millis(1),
            },
            256,
        )
        .recording_arrivals(),
    );
    let shutdown = CancellationToken::new();
    let mut relays = Vec::with_capacity(RELAYS);
    for i in 0..RELAYS {
        let config = RelayConfig {
            relay_id: RelayId::unique(&format!("hot-key-{i}")),
            ..RelayConfig::default()
        };
        let relay = Relay::new(store.clone(), publisher.clone(), config)?
            .with_wake_up(store.wake_up().await?);
        relays.push(relay.spawn(shutdown.clone()));
    }
    if kind == Burst::Apart {
        let config = RelayConfig {
            relay_id: RelayId::unique("hot-key-apart"),
            ..RelayConfig::default()
        };
        let relay = Relay::new(elsewhere.clone(), publisher.clone(), config)?
            .with_wake_up(elsewhere.wake_up().await?);
        relays.push(relay.spawn(shutdown.clone()));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let burst_started = Instant::now();
    let hot_ids: HashSet<EventId> = HashSet::new();
    let hot_ids = Arc::new(Mutex::new(hot_ids));
    let burst = {
        let store = match kind {
            Burst::Elsewhere | Burst::Apart => elsewhere.clone(),
            _ => store.clone(),
        };
        let hot_ids = hot_ids.clone();
        tokio::spawn(async move {
            let mut i = 0;
            while i < hot {
                let chunk: Vec<NewEvent> = (i..(i + BURST_CHUNK).min(hot))
                    .map(|n| hot_event(round, n))
                    .collect();
                let mut tx = store.pool().begin().await?;
                store.enqueue(&mut tx, &chunk).await?;
                tx.commit().await?;
                if kind != Burst::Elsewhere {
                    hot_ids
                        .lock()
                        .expect("hot ids")
                        .extend(chunk.iter().map(|e| e.event_id));
                }
                i += chunk.len();
            }
            Ok::<_, Error>(Instant::now())
        })
    };

    let total = RATE * seconds;
    let commits: Arc<Mutex<HashMap<EventId, Instant>>> = Arc::default();
    open_loop(RATE, total, |i| {
        let (store, commits) = (store.clone(), commits.clone());
        async move {
            let event = env::event(round, i as usize);
            let mut tx = store.pool().begin().await?;
            store.enqueue(&mut tx, std::slice::from_ref(&event)).await?;
            tx.commit().await?;
            commits
                .lock()
                .expect("commits")
                .insert(event.event_id, Instant::now());
            Ok(())
        }
    })
    .await?;
    let burst_committed = burst.await??;
    let everything = total
        + if matches!(kind, Burst::Relayed | Burst::Apart) {
            hot as u64
        } else {
            0
        };
    let reached =
        tokio::time::timeout(Duration::from_secs(180), publisher.wait_for(everything)).await;
    shutdown.cancel();
    for relay in relays {
        relay.await??;
    }
    if reached.is_err() {
        return Err(format!(
            "only {} of {everything} events delivered",
            publisher.delivered()
        )
        .into());
    }
    let arrivals = publisher.take_arrivals();
    let hot_ids = hot_ids.lock().expect("hot ids");
    let hot_done = hot_ids
        .iter()
        .filter_map(|id| arrivals.get(id))
        .max()
        .copied();
    let hot_drain = hot_done.map_or(0.0, |at| (at - burst_started).as_secs_f64());
    let commits = commits.lock().expect("commits");
    let mut others = Vec::with_capacity(commits.len());
    let mut others_during_commits = Vec::new();
    let mut others_after_commits = Vec::new();
    for (id, committed) in commits.iter() {
        // Only what was committed while the hot backlog drained.
        if hot_done.is_some_and(|done| *committed > done) {
            continue;
        }
        let arrived = arrivals
            .get(id)
            .ok_or_else(|| format!("event {id} never delivered"))?;
        let waited = arrived.saturating_duration_since(*committed).as_secs_f64() * 1_000.0;
        others.push(waited);
        if hot > 0 && *committed > burst_committed {
            others_after_commits.push(waited);
        } else if hot > 0 {
            others_during_commits.push(waited);
        }
    }
    if others.is_empty() {
        return Err("no other key's event was committed while the hot key drained".into());
    }
    Ok(Measured {
        others,
        others_during_commits,
        others_after_commits,
        hot_drain,
    })
}

/// Event `n` of the burst, on the hot key.
fn hot_event(round: usize, n: usize) -> NewEvent {
    env::event_on_key(HOT_KEY, &format!("hot-{round}-{n}"), n)
}
