//! The `outbox relay` daemon's own memory with many idle tenants (issue
//! 36): the binary beside the bench, `[tenants]` over the bench's tenant
//! schemas, its resident memory once every tenant's relay runs.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::env::{self, Error};

/// A running `outbox relay` over `tenants`, killed on drop.
pub struct Daemon {
    child: tokio::process::Child,
    health: String,
    config: std::path::PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

impl Daemon {
    /// Starts the daemon with `tenants` (a `[tenants]` body) and waits
    /// until `/health` says `expected` tenants run.
    pub async fn start(tenants: &str, expected: usize) -> Result<Self, Error> {
        let binary = env::outbox_binary()?;
        let health = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
            probe.local_addr()?.to_string()
        };
        let config = std::env::temp_dir().join(format!(
            "outbox-bench-tenants-{}-{}.toml",
            std::process::id(),
            health.replace([':', '.'], "-")
        ));
        std::fs::write(
            &config,
            format!(
                "url = \"{}/{}\"\n[tenants]\n{tenants}\n[broker]\nkind = \"redis\"\nurl = \"{}\"\n[http]\nlisten = \"{health}\"\n",
                env::pg_server(),
                env::DATABASE,
                env::redis_url(),
            ),
        )?;
        let child = tokio::process::Command::new(&binary)
            .args(["relay", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let daemon = Self {
            child,
            health,
            config,
        };
        let wanted = format!("ok: {expected} of {expected} tenants running");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            if daemon
                .health_body()
                .await
                .is_ok_and(|b| b.contains(&wanted))
            {
                return Ok(daemon);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!("the daemon never said {wanted:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn health_body(&self) -> Result<String, Error> {
        let mut stream = tokio::net::TcpStream::connect(&self.health).await?;
        stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n")
            .await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    /// The process's resident memory, KiB.
    pub fn resident_kib(&self) -> Result<f64, Error> {
        let pid = self.child.id().ok_or("the daemon exited")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| "no VmRSS".into())
    }
}

/// The daemon's resident KiB with tenant 0 alone and with every tenant
/// schema of the pattern (`n` of them), each measured after `settle`.
pub async fn resident(n: usize, settle: Duration) -> Result<(f64, f64), Error> {
    let one = Daemon::start("list = [\"bench_tenant_0\"]", 1).await?;
    tokio::time::sleep(settle).await;
    let alone = one.resident_kib()?;
    drop(one);
    let all = Daemon::start("schemas = \"bench\\\\_tenant\\\\_%\"", n).await?;
    tokio::time::sleep(settle).await;
    Ok((alone, all.resident_kib()?))
}
