//! Three application instances deploying beside a producer: `migrate()` on
//! current tables must take no lock a producer can queue behind.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use outbox_core::StoreError;

use crate::Migrated;

/// How long a producer's enqueue and commit may take while three
/// application instances call `migrate()` on current tables beside a
/// report holding the events table open (the rollout issue's bound).
pub const PRODUCER_BESIDE_MIGRATE: Duration = Duration::from_millis(100);

/// Attempts of [`three_deploys_beside_a_producer`]: a `migrate()` that
/// queued producers behind a lock holds every attempt for at least its
/// lock timeout (a second), while a parallel test run's CPU stall on a
/// small machine (once 188 ms of 609 tests at once) holds one.
const ATTEMPTS: usize = 3;

/// Three instances call `migrate()` at once (`deploy`) while `enqueue`
/// commits an unrelated event, all beside a report the caller holds open on
/// the events table: every migrate() returns at the current version, and
/// the enqueue commits within [`PRODUCER_BESIDE_MIGRATE`] in one of
/// three tries (each a new enqueue beside three new deploys).
pub async fn three_deploys_beside_a_producer<M, F, E, EF, X>(deploy: M, enqueue: E)
where
    M: Fn() -> F,
    F: Future<Output = Result<Migrated, StoreError>> + Send + 'static,
    E: Fn() -> EF,
    EF: Future<Output = Result<(), X>>,
    X: Debug,
{
    let mut waits = Vec::new();
    for _ in 0..ATTEMPTS {
        let deploys: Vec<_> = (0..3).map(|_| tokio::spawn(deploy())).collect();
        let started = Instant::now();
        let enqueued = tokio::time::timeout(Duration::from_secs(3), enqueue()).await;
        let waited = started.elapsed();
        for deploy in deploys {
            let migrated = tokio::time::timeout(Duration::from_secs(3), deploy)
                .await
                .expect("migrate() returned while the report was open")
                .expect("the deploy task ran")
                .expect("migrate() succeeded");
            assert_eq!(migrated.found, Some(2));
        }
        assert!(
            matches!(enqueued, Ok(Ok(()))),
            "a producer queued behind migrate(): {enqueued:?}"
        );
        waits.push(waited);
        if waited < PRODUCER_BESIDE_MIGRATE {
            return;
        }
    }
    panic!("the enqueue took {waits:?} beside three migrate() calls, each attempt");
}
