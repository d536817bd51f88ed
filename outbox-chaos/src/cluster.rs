//! The run's own servers: a private PostgreSQL cluster (the same helper the
//! store's server tests use) and a private `redis-server` with AOF.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[path = "../../outbox-sqlx/tests/support/private_pg.rs"]
mod private_pg;

pub(crate) use private_pg::PrivatePg;

/// A random lowercase name (the cluster helper names its directory with it).
fn unique_name(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// The cluster helper's answer to missing server binaries.
fn unreachable(service: &str, url: &str, error: impl std::fmt::Display) -> ! {
    panic!("{service} unreachable at {url}: {error}");
}

/// A free loopback port.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `redis-server` on a spare port, appending every write to its AOF with
/// `fsync` before the reply, so a kill loses nothing acknowledged.
pub(crate) struct PrivateRedis {
    pub(crate) port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateRedis {
    pub(crate) fn start() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(unique_name("outbox-chaos-redis"));
        std::fs::create_dir_all(&dir).expect("redis dir");
        let mut redis = Self {
            port,
            dir,
            child: None,
        };
        redis.spawn();
        redis
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server again on the same port and data.
    pub(crate) fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        self.child = Some(child);
        for _ in 0..400 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server on {} did not start", self.port);
    }

    /// Kills the server (SIGKILL: the AOF already holds every reply given).
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
