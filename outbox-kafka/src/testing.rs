//! A private Kafka-protocol broker for tests and fault runs (feature
//! `testing`): tansu, installed by the workspace's `scripts/kafka.sh`,
//! behind a proxy the caller can cut.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use outbox_core::testing::CuttableProxy;

/// A tansu broker of the caller's own (memory storage) behind a loopback
/// [`CuttableProxy`] it advertises, so every client connection (bootstrap
/// and after metadata) goes through the proxy. A broker outage is a cut:
/// tansu's memory storage would forget every message if its process were
/// killed, which a real broker's log does not. Killed on drop.
pub struct PrivateBroker {
    child: tokio::process::Child,
    proxy: CuttableProxy,
}

impl PrivateBroker {
    /// Starts tansu on a free port and waits until it accepts connections.
    /// Panics with the reason if it cannot (tansu not installed: run
    /// `scripts/kafka.sh`).
    pub async fn start() -> Self {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/tansu-path");
        let tansu = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/kafka.sh)", path.display()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a proxy port");
        let proxy_port = listener.local_addr().expect("proxy address").port();
        let broker_port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a broker port")
            .port();
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
            .unwrap_or_else(|e| panic!("{}: {e}", tansu.trim()));
        let upstream = SocketAddr::from(([127, 0, 0, 1], broker_port));
        for _ in 0..1000 {
            if tokio::net::TcpStream::connect(upstream).await.is_ok() {
                let proxy = CuttableProxy::start(upstream, listener).expect("the proxy starts");
                return Self { child, proxy };
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("tansu on port {broker_port} did not start within 10 s");
    }

    /// The bootstrap address (the proxy's).
    pub fn bootstrap(&self) -> String {
        self.proxy.address().to_string()
    }

    /// Closes every client connection and refuses new ones.
    pub fn cut(&self) {
        self.proxy.cut();
    }

    /// Client connections refused while cut (see
    /// [`CuttableProxy::wait_for_refused`]).
    pub fn proxy(&self) -> &CuttableProxy {
        &self.proxy
    }

    /// Accepts client connections again.
    pub fn restore(&self) {
        self.proxy.restore();
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
