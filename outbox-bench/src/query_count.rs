//! Counts the SQL statements sqlx sends, from its `sqlx::query` log events,
//! while switched on. Used to measure what an idle relay asks of the database.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

static ON: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU64 = AtomicU64::new(0);

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
        metadata.target() == "sqlx::query" && ON.load(Ordering::Relaxed)
    }

    fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
        COUNT.fetch_add(1, Ordering::Relaxed);
    }
}

/// Installs the counter as the global subscriber (off until [`start`]).
pub fn install() {
    use tracing_subscriber::layer::SubscriberExt;
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
