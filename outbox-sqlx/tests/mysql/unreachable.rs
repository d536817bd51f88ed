//! MariaDB out of reach: not a configuration mistake but an outage, which
//! the relay waits out; and a URL that cannot work, refused up front.

use std::time::Duration;

use outbox_core::memory::RecordingPublisher;
use outbox_core::testing::{CuttableProxy, events_over_keys, relay_suite};
use outbox_core::{CancellationToken, Relay};
use sqlx::mysql::MySqlConnectOptions;
use std::str::FromStr;
use tokio::net::TcpListener;

use super::*;

/// A relay started while MariaDB cannot be reached keeps running
/// (store errors, waited out with backoff; it does not stop as it does
/// on missing tables), and drains the backlog once MariaDB is reachable.
/// "Keeps running" is observed, not timed: its address is a proxy that
/// refuses connections, and the relay is still running after it was
/// refused five times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_while_mariadb_is_unreachable_drains_once_it_is_reachable() {
    let clock = ManualClock::at_epoch();
    let reachable = store_on(clock.clone()).await;
    let events = events_over_keys(20, 4);
    OutboxWriter::enqueue(&reachable, &events).await.unwrap();
    let database = reachable.config().tables.schema().unwrap().to_owned();

    let proxy = CuttableProxy::start(
        "127.0.0.1:3306".parse().unwrap(),
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
    )
    .unwrap();
    proxy.cut();
    let options = MySqlConnectOptions::from_str(&format!("mysql://root@{}", proxy.address()))
        .unwrap()
        .database(&database);
    let pool = MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy_with(options);
    let store = MySqlStore::new(pool, reachable.config().clone());
    let publisher = Arc::new(RecordingPublisher::new());
    let shutdown = CancellationToken::new();
    let relay = Relay::new(
        Arc::new(store),
        publisher.clone(),
        relay_suite::config("unreachable-mariadb"),
    )
    .unwrap()
    .spawn(shutdown.clone());

    proxy.wait_for_refused(5, Duration::from_secs(60)).await;
    assert!(
        !relay.is_finished(),
        "the relay stopped while MariaDB was unreachable: {:?}",
        relay.await
    );
    assert!(publisher.delivered().is_empty());

    proxy.restore();
    tokio::time::timeout(Duration::from_secs(60), publisher.wait_for_deliveries(20))
        .await
        .expect("the backlog drained once MariaDB was reachable");
    shutdown.cancel();
    let report = relay.await.unwrap().unwrap();
    assert!(report.store_errors >= 1, "{report:?}");
    assert_eq!((report.published, report.failed), (20, 0), "{report:?}");
}

/// A URL that cannot work is refused when the pool is built, before
/// any store or relay exists.
#[tokio::test]
async fn a_malformed_url_is_refused_when_the_pool_is_built() {
    for url in [
        "mysql://root@127.0.0.1:notaport/db",
        "mysql://root@127.0.0.1:3306:3306/db",
        "not a url",
    ] {
        let built = MySqlPoolOptions::new().connect_lazy(url);
        assert!(built.is_err(), "{url} was accepted");
    }
}
