//! The command line, as data.

use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// Migrate, inspect and repair a transactional outbox on PostgreSQL,
/// MySQL/MariaDB or SQLite.
#[derive(Debug, Parser)]
#[command(name = "outbox", version)]
pub struct Cli {
    /// The store: postgres://…, mysql://… (or mariadb://…), sqlite:PATH.
    #[arg(long, env = "OUTBOX_URL", global = true, hide_env_values = true)]
    pub url: Option<String>,
    /// PostgreSQL schema or MySQL/MariaDB database holding the tables
    /// (default: the search path, or the URL's database).
    #[arg(long, env = "OUTBOX_SCHEMA", global = true)]
    pub schema: Option<String>,
    /// Table name prefix (default `outbox_`).
    #[arg(long, env = "OUTBOX_PREFIX", global = true)]
    pub prefix: Option<String>,
    /// Output of read commands.
    #[arg(long, value_enum, default_value_t = Output::Text, global = true)]
    pub output: Output,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// How read commands print.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Lines for people.
    Text,
    /// One JSON document on stdout, for scripts.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the tables; quiet when they are up to date.
    Migrate,
    /// Per event type: claimable, oldest claimable age, parked, in flight,
    /// failed; what holds publication back; blocked keys; relays.
    Status {
        /// PostgreSQL, a schema per tenant: one line per schema `LIKE` this
        /// pattern holding an outbox (`tenant_%`), and their sum.
        #[arg(long, value_name = "SCHEMA_PATTERN", conflicts_with = "tenant_urls")]
        all_tenants: Option<String>,
        /// Tenants named by URL: one line per row of this query's
        /// `(tenant, url[, schema])` (as `[tenants] urls` reads them), and
        /// their sum.
        #[arg(long, value_name = "QUERY")]
        tenant_urls: Option<String>,
    },
    /// Failed events.
    Failed {
        /// List or show.
        #[command(subcommand)]
        action: FailedAction,
    },
    /// Move a failed event back to pending with a fresh attempt budget.
    Requeue(Repair),
    /// Leave a failed event failed but stop it blocking its key.
    Skip(Repair),
    /// Replace a failed event by a new one (same type, aggregate and key,
    /// new payload) that takes its place in the key's order.
    Supersede {
        /// The repair's event and record.
        #[command(flatten)]
        repair: Repair,
        /// The replacement's payload (JSON).
        #[arg(long)]
        payload: String,
    },
    /// Delete published events (and, with --inbox, inbox claims) older than
    /// a duration, in bounded batches.
    Purge {
        /// Age: 90s, 15m, 2h, 7d.
        #[arg(long, value_parser = crate::duration::parse)]
        older_than: Duration,
        /// Rows deleted per statement.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch_size: u32,
        /// Also purge inbox claims (keep them longer than any redelivery
        /// or replay window, or a late duplicate is applied again).
        #[arg(long)]
        inbox: bool,
    },
    /// Run a relay from a TOML file until SIGTERM/SIGINT (graceful drain),
    /// with `/metrics` and `/health` over HTTP if configured.
    Relay {
        /// The settings file (see the crate README); `OUTBOX_<SECTION>_<KEY>`
        /// variables override it, or replace it when it is left out.
        #[arg(long)]
        config: Option<std::path::PathBuf>,
    },
    /// Consumer dead letters on Redis, Kafka or SQS: list, show, replay
    /// (needs no store URL).
    DeadLetters {
        /// The broker: `redis://HOST[:PORT][/DB]`, `kafka://HOST:PORT[,…]`,
        /// or `sqs` (region, endpoint and credentials from AWS_REGION,
        /// AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
        /// AWS_SESSION_TOKEN).
        #[arg(long, env = "OUTBOX_BROKER", hide_env_values = true)]
        broker: String,
        /// What the consumer reads: the Redis stream or the Kafka topic
        /// (its dead letters are in `<source><suffix>`); on SQS, the
        /// dead-letter queue's URL.
        #[arg(long)]
        source: String,
        /// The consumer's dead-letter suffix (default `:dead` on Redis,
        /// `.dlq` on Kafka).
        #[arg(long)]
        suffix: Option<String>,
        /// List, show or replay.
        #[command(subcommand)]
        action: DeadLetterAction,
    },
    /// Serve the operators' dashboard over HTTP until SIGTERM/SIGINT:
    /// overview with charts, failed events, requeue / skip / supersede.
    Dashboard {
        /// Where to listen (loopback unless told otherwise; port 0 picks a
        /// free one, printed at start).
        #[arg(long, default_value = "127.0.0.1:8089")]
        listen: String,
        /// The token a visitor signs in with to act (requeue, skip,
        /// supersede); without one the dashboard is read-only.
        #[arg(long, env = "OUTBOX_DASHBOARD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// How often the charts' counts are read from the store.
        #[arg(long, default_value = "10s", value_parser = crate::duration::parse)]
        sample_every: Duration,
    },
    /// Exit non-zero with a one-line reason when something is stuck.
    Health {
        /// A claimable event older than this is stuck.
        #[arg(long, default_value = "5m", value_parser = crate::duration::parse)]
        max_age: Duration,
        /// A relay silent for longer than this is not live.
        #[arg(long, default_value = "1m", value_parser = crate::duration::parse)]
        relay_timeout: Duration,
        /// Blocked keys are reported but do not fail the check.
        #[arg(long)]
        allow_blocked: bool,
    },
}

/// `failed list` or `failed show ID`.
#[derive(Debug, Subcommand)]
pub enum FailedAction {
    /// Failed events, oldest first.
    List {
        /// Most events listed.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One failed event: its metadata and full history.
    Show {
        /// The event id (UUID).
        id: outbox_core::EventId,
        /// Also print the payload (it may hold personal data; left out by
        /// default).
        #[arg(long)]
        payload: bool,
    },
}

/// `dead-letters list`, `show ID` or `replay ID`.
#[derive(Debug, Subcommand)]
pub enum DeadLetterAction {
    /// Dead letters, oldest first (SQS: as received, sorted by time).
    List {
        /// Most dead letters listed.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// List those after this id (Redis entry id, Kafka partition/offset;
        /// not on SQS).
        #[arg(long)]
        after: Option<String>,
    },
    /// One dead letter: its error, identity and headers.
    Show {
        /// Its id (Redis entry id, Kafka partition/offset, SQS message id).
        id: String,
        /// Also print the payload (it may hold personal data).
        #[arg(long)]
        payload: bool,
    },
    /// Put a dead letter back where its consumer reads, once, recording
    /// who and why.
    Replay {
        /// Its id (Redis entry id, Kafka partition/offset, SQS message id).
        id: String,
        /// Why (kept in the replay's record).
        #[arg(long)]
        reason: String,
        /// Who (kept in the replay's record; default $USER).
        #[arg(long, env = "USER")]
        operator: String,
    },
}

/// Which event an operator repairs, who, and why (kept in its history).
#[derive(Debug, clap::Args)]
pub struct Repair {
    /// The event id (UUID).
    pub id: outbox_core::EventId,
    /// Why (recorded in the event's history).
    #[arg(long)]
    pub reason: String,
    /// Who (recorded in the event's history; default $USER).
    #[arg(long, env = "USER")]
    pub operator: String,
}
