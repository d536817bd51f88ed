//! A loopback TCP proxy a test can cut, standing in for a network partition
//! or a broker that went away without its process dying.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::net::{TcpListener, TcpStream};

/// Forwards every connection accepted on its listener to `upstream`. While
/// [cut](CuttableProxy::cut) it closes every live connection and refuses
/// new ones (accepts and drops them, as a peer that resets would);
/// [restore](CuttableProxy::restore) accepts again. Clients reconnect on
/// their own, as they would after a real cut.
#[derive(Debug)]
pub struct CuttableProxy {
    address: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Connections refused while cut: how often a client tried again.
    refused: Arc<AtomicU64>,
    /// Bumped on every cut; each forwarding task ends when it changes.
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl CuttableProxy {
    /// Forwards what `listener` accepts to `upstream`. The listener is the
    /// caller's so it can know (and advertise) the proxy's port before the
    /// upstream starts.
    pub fn start(upstream: SocketAddr, listener: TcpListener) -> std::io::Result<Self> {
        let address = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(tokio::sync::watch::channel(0u64).0);
        let refused = Arc::new(AtomicU64::new(0));
        let (cut2, refused2, generation2) = (cut.clone(), refused.clone(), generation.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                if cut2.load(Ordering::SeqCst) {
                    refused2.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                let mut cancelled = generation2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cancelled.changed() => {}
                    }
                });
            }
        });
        Ok(Self {
            address,
            cut,
            refused,
            generation,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Connections refused while cut so far: a client that keeps trying
    /// (and so is still running) makes this grow.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` connections were refused (panics after
    /// `limit`): proof that a client kept trying, without guessing how long
    /// that takes.
    pub async fn wait_for_refused(&self, n: u64, limit: std::time::Duration) {
        let waited = tokio::time::timeout(limit, async {
            while self.refused() < n {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "{} connection attempts refused within {limit:?}, wanted {n}",
            self.refused()
        );
    }

    /// Closes every live connection and refuses new ones until restored.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An echo server behind the proxy: bytes flow, a cut ends the live
    /// connection and refuses the next, a restore lets one through again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cut_closes_live_connections_and_refuses_new_ones_until_restored() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        let proxy = CuttableProxy::start(upstream, TcpListener::bind("127.0.0.1:0").await.unwrap())
            .unwrap();
        let mut live = TcpStream::connect(proxy.address()).await.unwrap();
        assert_eq!(&ping(&mut live).await.unwrap(), b"ping");

        proxy.cut();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            live.read_to_end(&mut rest),
        )
        .await
        .expect("the live connection is closed by the cut");
        assert!(read.is_err() || rest.is_empty(), "{read:?} {rest:?}");
        let mut refused = TcpStream::connect(proxy.address()).await.unwrap();
        assert!(
            ping(&mut refused).await.is_err(),
            "a new connection is refused while cut"
        );
        proxy
            .wait_for_refused(1, std::time::Duration::from_secs(5))
            .await;

        proxy.restore();
        let mut fresh = TcpStream::connect(proxy.address()).await.unwrap();
        let again = ping(&mut fresh)
            .await
            .expect("a connection after the restore is forwarded");
        assert_eq!(&again, b"ping");
    }

    async fn ping(stream: &mut TcpStream) -> std::io::Result<[u8; 4]> {
        stream.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        stream.read_exact(&mut buf).await?;
        Ok(buf)
    }
}
