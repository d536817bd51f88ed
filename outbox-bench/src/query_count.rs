//! Counts the SQL statements sqlx sends, from its `sqlx::query` log events,
//! while switched on. Used to measure what an idle relay asks of the database.
//!
//! With `OUTBOX_BENCH_SQL_PROFILE=1` it also keeps a statement profile: per
//! statement text, how often it ran, the time sqlx measured (from send to
//! the last row read) and the rows it returned or changed. Scenarios print
//! it per contender ([`print_profile`]): the profile that says where a
//! drain's time goes, without a database-side slow log.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

static ON: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU64 = AtomicU64::new(0);
static PROFILING: AtomicBool = AtomicBool::new(false);
static PROFILE: Mutex<Option<HashMap<String, Totals>>> = Mutex::new(None);

/// Characters of a statement's text that name it in the profile.
const STATEMENT_PREFIX: usize = 110;

/// One statement's totals.
#[derive(Default, Clone, Copy)]
struct Totals {
    runs: u64,
    seconds: f64,
    rows: u64,
}

/// The fields of one `sqlx::query` event the profile reads.
#[derive(Default)]
struct Statement {
    text: String,
    seconds: f64,
    rows: u64,
}

impl Visit for Statement {
    fn record_str(&mut self, field: &Field, value: &str) {
        // `db.statement` is the full text when it differs from the
        // summary, empty otherwise.
        if field.name() == "db.statement" || (field.name() == "summary" && self.text.is_empty()) {
            self.text = value.split_whitespace().collect::<Vec<_>>().join(" ");
        }
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if field.name() == "elapsed_secs" {
            self.seconds = value;
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "rows_returned" || field.name() == "rows_affected" {
            self.rows += value;
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

/// The layer; install once with [`install`].
struct QueryCounter;

impl<S: Subscriber> Layer<S> for QueryCounter {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.target() == "sqlx::query" {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target() == "sqlx::query"
            && (ON.load(Ordering::Relaxed) || PROFILING.load(Ordering::Relaxed))
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if ON.load(Ordering::Relaxed) {
            COUNT.fetch_add(1, Ordering::Relaxed);
        }
        if PROFILING.load(Ordering::Relaxed) {
            let mut statement = Statement::default();
            event.record(&mut statement);
            let key: String = statement.text.chars().take(STATEMENT_PREFIX).collect();
            let mut profile = PROFILE.lock().expect("profile lock");
            let totals = profile
                .get_or_insert_with(HashMap::new)
                .entry(key)
                .or_default();
            totals.runs += 1;
            totals.seconds += statement.seconds;
            totals.rows += statement.rows;
        }
    }
}

/// Installs the counter as the global subscriber (off until [`start`]);
/// the profile is on from here if `OUTBOX_BENCH_SQL_PROFILE` is set.
pub fn install() {
    use tracing_subscriber::layer::SubscriberExt;
    let profiling = std::env::var_os("OUTBOX_BENCH_SQL_PROFILE").is_some_and(|v| v != "0");
    PROFILING.store(profiling, Ordering::SeqCst);
    let subscriber = tracing_subscriber::registry().with(QueryCounter);
    tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
}

/// Starts counting from zero.
pub fn start() {
    COUNT.store(0, Ordering::SeqCst);
    ON.store(true, Ordering::SeqCst);
    tracing::callsite::rebuild_interest_cache();
}

/// Stops counting and returns the statements seen since [`start`].
pub fn stop() -> u64 {
    ON.store(false, Ordering::SeqCst);
    COUNT.load(Ordering::SeqCst)
}

/// When profiling, prints the statements seen since the last call under
/// `label` (most time first) and starts a new profile.
pub fn print_profile(label: &str) {
    if !PROFILING.load(Ordering::SeqCst) {
        return;
    }
    let profile = PROFILE
        .lock()
        .expect("profile lock")
        .take()
        .unwrap_or_default();
    let mut rows: Vec<(String, Totals)> = profile.into_iter().collect();
    rows.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
    let total: f64 = rows.iter().map(|(_, t)| t.seconds).sum();
    println!("### SQL profile: {label} ({total:.3} s in statements)");
    println!("|  runs |   total s | ms/run | rows/run | statement |");
    println!("|-------|-----------|--------|----------|-----------|");
    for (text, t) in rows.iter().take(15) {
        println!(
            "| {:>5} | {:>9.3} | {:>6.3} | {:>8.1} | {} |",
            t.runs,
            t.seconds,
            t.seconds * 1000.0 / t.runs as f64,
            t.rows as f64 / t.runs as f64,
            text
        );
    }
}

/// Forgets the profile so far (a backlog's fill, before the drain measured).
pub fn reset_profile() {
    PROFILE.lock().expect("profile lock").take();
}
