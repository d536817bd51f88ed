//! Shared by the live-Redis tests.
#![allow(dead_code)]

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

pub const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// The end-to-end tests' consumer of `{prefix}invoice.paid` in group
/// `billing`: short blocking reads, and pending entries reclaimed after
/// 100 ms idle (a killed consumer's entries move on quickly).
pub fn consumer_config(prefix: &str, consumer: &str) -> outbox_redis::ConsumerConfig {
    let mut config = outbox_redis::ConsumerConfig::new(
        "billing",
        consumer,
        vec![format!("{prefix}invoice.paid")],
    );
    config.block = Duration::from_millis(50);
    config.reclaim_idle = Duration::from_millis(100);
    config
}

/// A unique prefix per test, so tests never share keys.
pub fn prefix() -> String {
    format!("t{}:", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// A connection manager; an unreachable server fails the test (CI or not).
pub async fn connect(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).unwrap();
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Duration::from_secs(5))
        .set_connection_timeout(Duration::from_secs(2))
        .set_number_of_retries(1);
    match ConnectionManager::new_with_config(client, config).await {
        Ok(c) => c,
        Err(e) => panic!("Redis unreachable at {url}: {e} (start it with scripts/services.sh)"),
    }
}
