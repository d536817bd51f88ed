//! A private PostgreSQL cluster for tests that restore, replicate or burn
//! transaction ids: `initdb` + `pg_ctl` of the installed PostgreSQL on a
//! free loopback port, in a directory of its own, stopped and removed on
//! drop. The shared server is never touched. Used by the stores' server
//! tests and by the chaos run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The installed server binaries (`OUTBOX_PG_BIN`, else the newest under
/// /usr/lib/postgresql).
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("OUTBOX_PG_BIN") {
        return dir.into();
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    versions.sort();
    match versions.pop() {
        Some(version) => version.join("bin"),
        None => panic!(
            "PostgreSQL server binaries not installed under /usr/lib/postgresql/*/bin \
             (set OUTBOX_PG_BIN, or install them with scripts/services.sh)"
        ),
    }
}

fn as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs a server binary; as root, as the `postgres` user (initdb and the
/// server refuse to run as root).
fn run(program: &Path, args: &[&str]) -> Output {
    let mut command = if as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    let output = command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} {args:?} failed: {}{}",
        program.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A running private cluster.
pub struct PrivatePg {
    dir: PathBuf,
    port: u16,
}

impl PrivatePg {
    /// Creates and starts a cluster with `settings` added to its config
    /// (e.g. `wal_level = logical`).
    pub fn start(settings: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("outbox-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("cluster dir");
        // The server's user must own it.
        let _ = Command::new("chown")
            .args(["postgres:postgres", &dir.display().to_string()])
            .status();
        let bin = bin_dir();
        let data = dir.join("data");
        run(
            &bin.join("initdb"),
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        let mut conf = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 32MB\n",
            dir.display()
        );
        for setting in settings {
            conf.push_str(setting);
            conf.push('\n');
        }
        let conf_path = data.join("postgresql.conf");
        let mut existing = std::fs::read_to_string(&conf_path).expect("postgresql.conf");
        existing.push_str(&conf);
        std::fs::write(&conf_path, existing).expect("write postgresql.conf");
        let cluster = Self { dir, port };
        cluster.pg_ctl(&["-w", "start"]);
        cluster
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection URL to `database`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Runs `pg_ctl` on this cluster's data directory and log with `args`.
    fn pg_ctl(&self, args: &[&str]) {
        let data = self.dir.join("data").display().to_string();
        let log = self.dir.join("log").display().to_string();
        let mut all = vec!["-D", data.as_str(), "-l", log.as_str()];
        all.extend_from_slice(args);
        run(&bin_dir().join("pg_ctl"), &all);
    }

    /// Restarts the server as an operator would (`pg_ctl restart -m fast`):
    /// every connection is terminated (57P01) and refused until it is back.
    pub fn restart_fast(&self) {
        self.pg_ctl(&["-m", "fast", "-w", "restart"]);
    }

    /// Stops the server (`pg_ctl stop -m fast`); [`Self::resume`] starts it.
    pub fn stop(&self) {
        self.pg_ctl(&["-m", "fast", "-w", "stop"]);
    }

    /// Starts a stopped server again on the same port and data.
    pub fn resume(&self) {
        self.pg_ctl(&["-w", "start"]);
    }

    /// Runs `psql -c sql` on `database`, failing the test on error.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let output = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-At", "-d"])
            .arg(self.url(database))
            .args(["-c", sql])
            .output()
            .expect("run psql");
        assert!(
            output.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Gives its transaction-id counter `n` more: a cluster that has lived
    /// longer than another.
    pub fn burn_xids(&self, database: &str, n: u32) {
        self.psql(
            database,
            "CREATE OR REPLACE PROCEDURE outbox_test_burn(n int) LANGUAGE plpgsql AS $$
             BEGIN FOR i IN 1..n LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$",
        );
        self.psql(database, &format!("CALL outbox_test_burn({n})"));
        self.psql(database, "DROP PROCEDURE outbox_test_burn(int)");
    }

    /// `pg_dump database | psql` into `target`'s `database` (created there).
    pub fn dump_into(&self, target: &PrivatePg, database: &str) {
        let dump = Command::new("pg_dump")
            .args(["--no-owner", "--no-privileges", "-d"])
            .arg(self.url(database))
            .output()
            .expect("run pg_dump");
        assert!(
            dump.status.success(),
            "pg_dump: {}",
            String::from_utf8_lossy(&dump.stderr)
        );
        target.psql("postgres", &format!("CREATE DATABASE {database}"));
        let file = self.dir.join(format!("{database}.sql"));
        std::fs::write(&file, &dump.stdout).expect("write the dump");
        let restore = Command::new("psql")
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(target.url(database))
            .arg("-f")
            .arg(&file)
            .output()
            .expect("run psql");
        assert!(
            restore.status.success(),
            "restore: {}",
            String::from_utf8_lossy(&restore.stderr)
        );
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let data = self.dir.join("data").display().to_string();
        let pg_ctl = bin_dir().join("pg_ctl");
        let mut command = if as_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&pg_ctl);
            c
        } else {
            Command::new(&pg_ctl)
        };
        let _ = command
            .args(["-D", &data, "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
