//! `outbox-chaos`: the multi-process fault run of the reliability issue, in
//! the repository.
//!
//! ```text
//! outbox-chaos run [--full] [--kafka] [--events N] [--broker-outage-secs S]
//!                                                    the orchestrator
//! outbox-chaos soak [--full] [--minutes N]          the soak run (time)
//! outbox-chaos tenants [--minutes N] [--tenants N] [--connections N] [--pg-setting S]
//!                                                    the tenants soak
//! outbox-chaos relay   PG_URL BROKER_URL NAME        one relay process
//! outbox-chaos consume PG_URL BROKER_URL NAME        one consumer process
//! ```
//!
//! `run` starts a private PostgreSQL cluster (`initdb` + `pg_ctl` on a spare
//! loopback port) and a private broker (`redis-server` with AOF, or with
//! `--kafka` a tansu broker behind a proxy the run can cut), runs a producer
//! over 200 keys, four relay processes it SIGKILLs and restarts every 1–3 s,
//! and one consumer process feeding a PostgreSQL inbox; meanwhile it stops
//! the broker, restarts PostgreSQL fast, kills the consumer once (restarting
//! it under the same name) and blips the broker. At the end it prints a table and
//! exits non-zero on any loss, double application or per-key order
//! violation at the handler.

mod cluster;
mod roles;
mod run;
mod soak;
mod tenants;

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let outcome = match args.first().map(String::as_str) {
        Some("run") => runtime.block_on(run::run(run::Settings::from_args(&args[1..]))),
        Some("soak") => runtime.block_on(soak::run(soak::Settings::from_args(&args[1..]))),
        Some("tenants") => {
            runtime.block_on(tenants::run(tenants::Settings::from_args(&args[1..])))
        }
        Some("relay") if args.len() == 4 => {
            runtime.block_on(roles::relay(&args[1], &args[2], &args[3]))
        }
        Some("consume") if args.len() == 4 => {
            runtime.block_on(roles::consume(&args[1], &args[2], &args[3]))
        }
        _ => Err("usage: outbox-chaos run [--full] [--kafka] [--events N] [--broker-outage-secs S] [--database-down-secs S] | soak [--full] [--minutes N] | tenants [--minutes N] [--tenants N] [--connections N] [--pg-setting S] | relay PG BROKER NAME | consume PG BROKER NAME".into()),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("outbox-chaos: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Every fallible step reports a message; the run exits non-zero with it.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;
