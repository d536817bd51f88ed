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

/// A redis-server of the test's own on a spare port, persisting to a temp
/// dir with AOF so a restart keeps its streams and groups.
pub struct OwnRedis {
    pub port: u16,
    dir: std::path::PathBuf,
    child: Option<tokio::process::Child>,
}

impl OwnRedis {
    pub async fn start() -> Self {
        let port = {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            socket.local_addr().unwrap().port()
        };
        let dir = std::env::temp_dir().join(format!("outbox-redis-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut own = Self {
            port,
            dir,
            child: None,
        };
        own.spawn().await;
        own
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let child = tokio::process::Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server is installed");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).unwrap();
        for _ in 0..200 {
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("own redis-server on {} did not start", self.port);
    }

    /// Stops the server (AOF flushed) and waits for the process to exit.
    pub async fn stop(&mut self) {
        if let Ok(client) = redis::Client::open(self.url()) {
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                let _: Result<(), _> = redis::cmd("SHUTDOWN").query_async(&mut c).await;
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait().await;
        }
    }

    /// Kills the server (SIGKILL: connections drop without a goodbye).
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Stops the server's process (SIGSTOP): connections stay open and
    /// nothing answers, as a server stalled by swap or a long fork.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self
            .child
            .as_ref()
            .and_then(|child| child.id())
            .expect("the server is running");
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}: {status}");
    }

    pub async fn restart(&mut self) {
        self.spawn().await;
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
