//! The `outbox relay` daemon the tenants soak runs: its configuration, its
//! process (redeployed with SIGTERM), its `/health`, its resident memory
//! and its connections to the server.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Settings;
use crate::Error;

/// The application name of the soak's own connections (producers, the
/// watcher): every other client of the soak database is the daemon's.
pub(super) const OWN_APPLICATION: &str = "soak-own";

/// The `outbox relay` process over every tenant schema.
pub(super) struct Daemon {
    config: PathBuf,
    log: PathBuf,
    pub(super) http: String,
    child: Option<Child>,
}

impl Daemon {
    /// Writes the daemon's configuration beside `dir` and starts it.
    pub(super) fn start(
        dir: &std::path::Path,
        database: &str,
        redis: &str,
        settings: &Settings,
    ) -> Result<Self, Error> {
        let http = free_address()?;
        let config = dir.join("tenants-relay.toml");
        std::fs::write(
            &config,
            format!(
                r#"url = "{database}"

[relay]
id = "soak"

[tenants]
schemas = "t\\_%"
refresh = "1s"
connections = {connections}

[purge]
published_older_than = "{retention}s"
every = "{purge_every}s"

[broker]
kind = "redis"
url = "{redis}"
stream_prefix = "outbox:"

[http]
listen = "{http}"
"#,
                connections = settings.connections,
                retention = settings.retention.as_secs(),
                purge_every = settings.purge_every.as_secs(),
            ),
        )?;
        let mut daemon = Self {
            config,
            log: dir.join("tenants-relay.log"),
            http,
            child: None,
        };
        daemon.spawn()?;
        Ok(daemon)
    }

    fn spawn(&mut self) -> Result<(), Error> {
        let binary = std::env::current_exe()?.with_file_name("outbox");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&binary)
            .args(["relay", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                format!(
                    "start {} (cargo build -p outbox-cli): {e}",
                    binary.display()
                )
            })?;
        self.child = Some(child);
        Ok(())
    }

    /// Where its log goes (shown when the soak fails).
    pub(super) fn log(&self) -> &std::path::Path {
        &self.log
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A deploy: SIGTERM, the process drains every tenant and exits (SIGKILL
    /// after 30 s), then a new one starts.
    pub(super) fn redeploy(&mut self) -> Result<(), Error> {
        if let Some(mut child) = self.child.take() {
            Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && child.try_wait()?.is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
            if child.try_wait()?.is_none() {
                let _ = child.kill();
                return Err("the daemon did not drain within 30 s of SIGTERM".into());
            }
        }
        self.spawn()
    }

    /// The process's resident memory, MiB.
    pub(super) fn rss_mib(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib / 1024.0)
    }

    /// `/health`'s body (empty when it does not answer).
    pub(super) async fn health(&self) -> String {
        let answer = async {
            let mut stream = tokio::net::TcpStream::connect(&self.http).await?;
            stream
                .write_all(b"GET /health HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
                .await?;
            let mut body = String::new();
            stream.read_to_string(&mut body).await?;
            Ok::<_, std::io::Error>(body)
        };
        tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default()
    }

    /// Waits (up to `limit`) until `/health` says `ok: N of N tenants
    /// running` where N is the number of tenant schemas in the database at
    /// that poll (the churn adds one before it drops another, so a count
    /// taken once goes stale); on timeout, the last `/health` body.
    pub(super) async fn until_all_running(
        &self,
        pool: &sqlx::PgPool,
        limit: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let tenants = tenant_schemas(pool).await.map_err(|e| e.to_string())?;
            let last = self.health().await;
            if last.contains(&format!("ok: {tenants} of {tenants} tenants running")) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("{tenants} tenant schemas; /health said: {last}"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The schemas the daemon's `schemas = "t\\_%"` source lists now.
async fn tenant_schemas(pool: &sqlx::PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(r"SELECT count(*) FROM pg_namespace WHERE nspname LIKE 't\_%'")
        .fetch_one(pool)
        .await
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_address() -> Result<String, Error> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// The daemon's connections to the soak database now.
pub(super) async fn daemon_connections(pool: &sqlx::PgPool) -> Result<i64, Error> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND backend_type = 'client backend'
           AND application_name NOT IN ($1, 'psql')",
    )
    .bind(OWN_APPLICATION)
    .fetch_one(pool)
    .await?)
}
