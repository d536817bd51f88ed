//! The fleet over in-memory stores: tenants come and go while it runs, and
//! a tenant that cannot start, hangs or panics holds no one else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::memory::{MemoryStore, RecordingPublisher};
use crate::policy::RetryPolicy;
use crate::relay::{Relay, RelayConfig};
use crate::store::{OutboxWriter, RelayId};
use crate::testing::event;
use crate::{EventId, StoreError};

/// How a test tenant starts.
#[derive(Clone, Copy)]
enum Start {
    Works,
    /// The factory fails until the test migrates the tenant.
    Unmigrated,
    /// The factory never answers.
    Hangs,
    /// The factory panics this many times first.
    PanicsFirst(u32),
}

struct Tenant {
    store: Arc<MemoryStore>,
    publisher: Arc<RecordingPublisher>,
    start: Start,
    attempts: AtomicU32,
    migrated: std::sync::atomic::AtomicBool,
}

#[derive(Clone, Default)]
struct Factory(Arc<Mutex<HashMap<TenantId, Arc<Tenant>>>>);

impl Factory {
    fn add(&self, id: &str, start: Start) -> (Arc<MemoryStore>, Arc<RecordingPublisher>) {
        let tenant = Arc::new(Tenant {
            store: Arc::new(MemoryStore::new()),
            publisher: Arc::new(RecordingPublisher::new()),
            start,
            attempts: AtomicU32::new(0),
            migrated: std::sync::atomic::AtomicBool::new(false),
        });
        let handles = (tenant.store.clone(), tenant.publisher.clone());
        self.0.lock().unwrap().insert(id_of(id), tenant);
        handles
    }

    fn migrate(&self, id: &str) {
        self.0.lock().unwrap()[&id_of(id)]
            .migrated
            .store(true, Ordering::SeqCst);
    }
}

#[async_trait]
impl TenantRelayFactory for Factory {
    type Store = MemoryStore;
    type Publisher = RecordingPublisher;

    async fn relay(
        &self,
        tenant: &TenantId,
    ) -> Result<Relay<MemoryStore, RecordingPublisher>, StoreError> {
        let found = self.0.lock().unwrap().get(tenant).cloned();
        let found = found.ok_or_else(|| StoreError::fatal(format!("no tenant {tenant}")))?;
        let attempt = found.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        match found.start {
            Start::Unmigrated if !found.migrated.load(Ordering::SeqCst) => {
                return Err(StoreError::fatal(format!("{tenant}: tables not migrated")));
            }
            Start::PanicsFirst(n) if attempt <= n => panic!("{tenant}: the factory panicked"),
            Start::Hangs => std::future::pending::<()>().await,
            _ => {}
        }
        let config = RelayConfig {
            relay_id: RelayId::new(format!("{tenant}/relay")),
            poll_interval: Duration::from_millis(10),
            ..RelayConfig::default()
        };
        Ok(Relay::new(found.store.clone(), found.publisher.clone(), config).expect("settings"))
    }
}

fn id_of(id: &str) -> TenantId {
    TenantId::new(id).unwrap()
}

fn config() -> FleetConfig {
    FleetConfig {
        refresh: Duration::from_millis(20),
        restart: RetryPolicy {
            initial_interval: Duration::from_millis(10),
            max_interval: Duration::from_millis(40),
            ..RetryPolicy::default()
        },
        ..FleetConfig::default()
    }
}

async fn enqueue(store: &MemoryStore, key: &str) -> EventId {
    let event = event(key, 0);
    let id = event.event_id;
    OutboxWriter::enqueue(store, &[event]).await.unwrap();
    id
}

/// Waits (up to 5 s) until `done` holds; panics with `what` otherwise.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting until {what}");
}

fn published(publisher: &RecordingPublisher, id: EventId) -> bool {
    publisher.delivered_ids().contains(&id)
}

#[tokio::test]
async fn tenants_added_and_removed_while_running_start_and_stop() {
    let factory = Factory::default();
    let (a_store, a_pub) = factory.add("a", Start::Works);
    let (b_store, b_pub) = factory.add("b", Start::Works);
    let (c_store, c_pub) = factory.add("c", Start::Works);
    let list = TenantList::new([id_of("a"), id_of("b")]);
    let fleet = TenantFleet::new(list.clone(), factory, config());
    let status = fleet.status();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(fleet.run(shutdown.clone()));

    let (a1, b1) = (enqueue(&a_store, "k").await, enqueue(&b_store, "k").await);
    until("a and b publish", || {
        published(&a_pub, a1) && published(&b_pub, b1)
    })
    .await;
    let c1 = enqueue(&c_store, "k").await;
    assert!(status.tenant(&id_of("c")).is_none(), "c is not listed yet");

    list.add(id_of("c"));
    until("c, added while running, publishes", || {
        published(&c_pub, c1)
    })
    .await;

    list.remove(&id_of("a"));
    until("a, removed, is forgotten", || {
        status.tenant(&id_of("a")).is_none()
    })
    .await;
    let a2 = enqueue(&a_store, "k").await;
    let b2 = enqueue(&b_store, "k").await;
    until("b goes on", || published(&b_pub, b2)).await;
    assert!(!published(&a_pub, a2), "a removed tenant's relay stopped");

    shutdown.cancel();
    let report = running.await.unwrap();
    assert_eq!(report.failures, 0);
    assert_eq!(report.tenants[&id_of("a")].published, 1);
    assert_eq!(report.tenants[&id_of("b")].published, 2);
    assert_eq!(report.tenants[&id_of("c")].published, 1);
    assert_eq!(report.total().published, 4);
    assert!(report.total().drained);
}

#[tokio::test]
async fn a_tenant_that_cannot_start_is_retried_alone() {
    let factory = Factory::default();
    let (ok_store, ok_pub) = factory.add("ok", Start::Works);
    let (bad_store, bad_pub) = factory.add("unmigrated", Start::Unmigrated);
    let (panicky_store, panicky_pub) = factory.add("panicky", Start::PanicsFirst(1));
    factory.add("hung", Start::Hangs);
    let list = TenantList::new(["ok", "unmigrated", "panicky", "hung"].map(id_of));
    let fleet = TenantFleet::new(list.clone(), factory.clone(), config());
    let status = fleet.status();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(fleet.run(shutdown.clone()));

    let ok = enqueue(&ok_store, "k").await;
    until("the healthy tenant publishes", || published(&ok_pub, ok)).await;
    until(
        "the unmigrated tenant is retried, its error reported",
        || {
            matches!(
                status.tenant(&id_of("unmigrated")),
                Some(TenantStatus { state: TenantState::Retrying { ref error, failures, .. }, .. })
                    if error.contains("tables not migrated") && failures >= 3
            )
        },
    )
    .await;
    let ok2 = enqueue(&ok_store, "k").await;
    until("the healthy tenant goes on meanwhile", || {
        published(&ok_pub, ok2)
    })
    .await;

    factory.migrate("unmigrated");
    let bad = enqueue(&bad_store, "k").await;
    let panicky = enqueue(&panicky_store, "k").await;
    until("both recover on their own", || {
        published(&bad_pub, bad) && published(&panicky_pub, panicky)
    })
    .await;
    let unmigrated = status.tenant(&id_of("unmigrated")).unwrap();
    assert_eq!(unmigrated.state, TenantState::Running);
    let failed_starts = unmigrated.starts - 1;
    assert_eq!(
        status.tenant(&id_of("hung")).map(|s| s.state),
        Some(TenantState::Starting),
        "a factory that never answers stays starting, holding no one"
    );

    list.remove(&id_of("hung"));
    until("the hung tenant, removed, is forgotten", || {
        status.tenant(&id_of("hung")).is_none()
    })
    .await;
    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the fleet stops")
        .unwrap();
    assert_eq!(
        report.failures,
        u64::from(failed_starts) + 1,
        "the failed starts and the panic"
    );
    assert_eq!(report.total().published, 4);
}

#[tokio::test]
async fn a_failing_source_keeps_the_tenants_it_had() {
    struct Flaky {
        reads: AtomicU32,
        list: TenantList,
    }
    #[async_trait]
    impl TenantSource for Flaky {
        async fn tenants(&self) -> Result<std::collections::BTreeSet<TenantId>, StoreError> {
            if self.reads.fetch_add(1, Ordering::SeqCst) == 0 {
                self.list.tenants().await
            } else {
                Err(StoreError::retryable("the tenants table is unreachable"))
            }
        }
    }
    let factory = Factory::default();
    let (store, publisher) = factory.add("a", Start::Works);
    let source = Flaky {
        reads: AtomicU32::new(0),
        list: TenantList::new([id_of("a")]),
    };
    let fleet = TenantFleet::new(source, factory, config());
    let status = fleet.status();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(fleet.run(shutdown.clone()));
    until("the source's error is reported", || {
        status.source_error().is_some()
    })
    .await;
    let id = enqueue(&store, "k").await;
    until("the tenant read before goes on", || {
        published(&publisher, id)
    })
    .await;
    assert!(status.source_error().unwrap().contains("unreachable"));
    shutdown.cancel();
    assert_eq!(running.await.unwrap().total().published, 1);
}
