//! `OUTBOX_BENCH_TRACE_PUBLISHES=1`: one stderr line per publish call of
//! the counting publisher: when it started (ms since the first call), how
//! long it took, how many events of the `hot` key and of the others it
//! carried, and how old the oldest of the others was (store time of the
//! insert to the call). How the other keys' events share batches with a
//! hot key's showed why they waited (BENCHMARKS.md, "A hot key beside the
//! others").

use std::sync::OnceLock;
use std::time::Instant;

use outbox_core::event::StoredEvent;

/// Whether the trace is on (read once).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("OUTBOX_BENCH_TRACE_PUBLISHES").is_some())
}

/// Prints one call's line, if the trace is on.
pub fn record(started: Instant, ended: Instant, batch: &[&StoredEvent]) {
    if !enabled() {
        return;
    }
    static FIRST: OnceLock<Instant> = OnceLock::new();
    let first = *FIRST.get_or_init(|| started);
    let hot = batch.iter().filter(|e| e.partition_key == "hot").count();
    let oldest_other = batch
        .iter()
        .filter(|e| e.partition_key != "hot")
        .map(|e| e.created_at)
        .min()
        .map(|at| (chrono::Utc::now() - at).num_milliseconds());
    eprintln!(
        "publish at={:.1}ms took={:.1}ms hot={hot} others={} oldest_other_ms={}",
        started.saturating_duration_since(first).as_secs_f64() * 1_000.0,
        (ended - started).as_secs_f64() * 1_000.0,
        batch.len() - hot,
        oldest_other.map_or_else(|| "-".to_owned(), |ms| ms.to_string()),
    );
}
