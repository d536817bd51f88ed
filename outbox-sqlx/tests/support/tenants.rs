//! What the tenant fleets' tests share: a fleet that notices changes
//! within 100 ms and retries a broken tenant within 200 ms, and a wait.

use std::time::Duration;

use outbox_core::policy::RetryPolicy;
use outbox_core::tenants::FleetConfig;

/// Refreshes every 100 ms; restarts a failed tenant after 50–200 ms.
pub fn quick_fleet() -> FleetConfig {
    FleetConfig {
        refresh: Duration::from_millis(100),
        restart: RetryPolicy {
            initial_interval: Duration::from_millis(50),
            max_interval: Duration::from_millis(200),
            ..RetryPolicy::default()
        },
        ..FleetConfig::default()
    }
}

/// Waits (up to 30 s) until `done` holds; fails the test naming `what`.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting until {what}");
}
