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

/// A tansu broker of the run's own (memory storage) behind a loopback TCP
/// proxy it advertises, so every client connection goes through the proxy.
/// Stopping the broker is cutting the proxy (live connections closed, new
/// ones refused): tansu's memory storage would forget every message if its
/// process were killed, which a real broker's log does not.
pub(crate) struct PrivateKafka {
    child: tokio::process::Child,
    proxy: CuttableProxy,
}

impl PrivateKafka {
    pub(crate) async fn start() -> Self {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/tansu-path");
        let tansu = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/kafka.sh)", path.display()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a proxy port");
        let proxy_port = listener.local_addr().expect("proxy address").port();
        let broker_port = free_port();
        let child = tokio::process::Command::new(tansu.trim())
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://127.0.0.1:{broker_port}"),
                "--advertised-listener-url",
                &format!("tcp://127.0.0.1:{proxy_port}"),
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("tansu starts");
        let upstream: std::net::SocketAddr = format!("127.0.0.1:{broker_port}")
            .parse()
            .expect("an address");
        for _ in 0..400 {
            if tokio::net::TcpStream::connect(upstream).await.is_ok() {
                return Self {
                    child,
                    proxy: CuttableProxy::start(upstream, listener),
                };
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("tansu on {broker_port} did not start");
    }

    /// The bootstrap address (the proxy).
    pub(crate) fn bootstrap(&self) -> String {
        self.proxy.address.to_string()
    }

    /// Cuts every connection and refuses new ones.
    pub(crate) fn stop(&self) {
        self.proxy.cut();
    }

    /// Accepts connections again.
    pub(crate) fn resume(&self) {
        self.proxy.restore();
    }
}

impl Drop for PrivateKafka {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A loopback TCP proxy that can be cut: while cut, it closes every live
/// connection and refuses new ones.
struct CuttableProxy {
    address: std::net::SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    generation: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
}

impl CuttableProxy {
    fn start(upstream: std::net::SocketAddr, listener: tokio::net::TcpListener) -> Self {
        use std::sync::atomic::Ordering;
        let address = listener.local_addr().expect("proxy address");
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let generation = std::sync::Arc::new(tokio::sync::watch::channel(0u64).0);
        let (cut2, generation2) = (cut.clone(), generation.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if cut2.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let mut cancelled = generation2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cancelled.changed() => {}
                    }
                });
            }
        });
        Self {
            address,
            cut,
            generation,
        }
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
