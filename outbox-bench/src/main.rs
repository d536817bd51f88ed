//! `cargo run --release -p outbox-bench -- <scenario|all> [--quick] [--rounds N] [--only CONTENDER] [--relays N] [--out DIR]`
//!
//! Measures the relay side by side with baselines implemented here, on the
//! same databases and driver, contenders interleaved round by round. Prints
//! a table per scenario and the targets, writes `results.jsonl` and PNG
//! plots into `--out` (default `target/bench`). Exits non-zero if a
//! scenario errors or loses an event; a missed target is reported, not fatal,
//! except an ordered drain below a quarter of the unordered one (`keys`).

mod counting;
mod env;
mod fleet;
mod open_loop;
mod pgq;
mod plot;
mod publish_trace;
mod query_count;
mod relay_process;
mod relay_run;
mod report;
mod scenario;
mod seed;
mod seed_mysql;
mod stats;

use std::path::PathBuf;
use std::time::Instant;

use report::Report;
use scenario::Scale;

/// What `all` runs.
const SCENARIOS: [&str; 14] = [
    "drain",
    "drain-sql",
    "keys",
    "brokers",
    "dialects",
    "latency",
    "hot-key",
    "week",
    "read-view",
    "enqueue",
    "claim",
    "pgq",
    "dashboard",
    "tenants",
];

/// `drain-sql` on one of its dialects (not in `all`, which runs both).
const ONE_DIALECT: [&str; 2] = ["drain-mariadb", "drain-sqlite"];

struct Args {
    scenarios: Vec<String>,
    scale: Scale,
    out: PathBuf,
}

fn usage() -> ! {
    eprintln!(
        "usage: outbox-bench <all|{}|{}>... [--quick] [--rounds N] [--only CONTENDER] [--relays N] [--out DIR]",
        SCENARIOS.join("|"),
        ONE_DIALECT.join("|")
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut scenarios = Vec::new();
    let mut quick = false;
    let mut rounds = None;
    let mut only = None;
    let mut relays = 1;
    let mut out = PathBuf::from("target/bench");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--rounds" => {
                rounds = Some(
                    args.next()
                        .and_then(|n| n.parse::<usize>().ok())
                        .filter(|n| *n >= 1)
                        .unwrap_or_else(|| usage()),
                )
            }
            "--only" => only = Some(args.next().unwrap_or_else(|| usage())),
            "--relays" => {
                relays = args
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|n| *n >= 1)
                    .unwrap_or_else(|| usage())
            }
            "--out" => out = PathBuf::from(args.next().unwrap_or_else(|| usage())),
            "all" => scenarios.extend(SCENARIOS.iter().map(|s| s.to_string())),
            name if SCENARIOS.contains(&name) || ONE_DIALECT.contains(&name) => {
                scenarios.push(name.to_string())
            }
            _ => usage(),
        }
    }
    if scenarios.is_empty() {
        usage();
    }
    Args {
        scenarios,
        scale: Scale {
            rounds: rounds.unwrap_or(3),
            quick,
            only,
            relays,
        },
        out,
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if std::env::args().nth(1).as_deref() == Some(relay_process::SUBCOMMAND) {
        let result = relay_process::Args::parse(std::env::args().skip(2))
            .and_then(|args| runtime.block_on(relay_process::run(args)));
        if let Err(error) = result {
            eprintln!("{}: {error}", relay_process::SUBCOMMAND);
            std::process::exit(1);
        }
        return;
    }
    let args = parse_args();
    query_count::install();
    let code = runtime.block_on(run(args));
    std::process::exit(code);
}

async fn run(args: Args) -> i32 {
    let mut report = match Report::create(&args.out) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("cannot write into {}: {error}", args.out.display());
            return 1;
        }
    };
    println!(
        "# outbox-bench {} ({} rounds{}; {} CPUs; build {})",
        args.scenarios.join(" "),
        args.scale.rounds,
        if args.scale.quick {
            ", --quick: smoke sizes, figures not comparable"
        } else {
            ""
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    );
    let mut failed = Vec::new();
    for name in &args.scenarios {
        let started = Instant::now();
        eprintln!("==> {name}");
        let result = match name.as_str() {
            "drain" => scenario::drain::run(args.scale.clone(), &mut report).await,
            "drain-sql" => {
                let dialects = ["mariadb", "sqlite"];
                scenario::drain_sql::run(args.scale.clone(), &dialects, &mut report).await
            }
            "drain-mariadb" | "drain-sqlite" => {
                let dialect = [&name["drain-".len()..]];
                scenario::drain_sql::run(args.scale.clone(), &dialect, &mut report).await
            }
            "brokers" => scenario::brokers::run(args.scale.clone(), &mut report).await,
            "dialects" => scenario::dialects::run(args.scale.clone(), &mut report).await,
            "latency" => scenario::latency::run(args.scale.clone(), &mut report).await,
            "hot-key" => scenario::hot_key::run(args.scale.clone(), &mut report).await,
            "week" => scenario::week::run(args.scale.clone(), &mut report).await,
            "read-view" => scenario::read_view::run(args.scale.clone(), &mut report).await,
            "tenants" => match scenario::tenants::run(args.scale.clone(), &mut report).await {
                Ok(()) => scenario::tenants_mariadb::run(args.scale.clone(), &mut report).await,
                failed => failed,
            },
            "enqueue" => scenario::enqueue::run(args.scale.clone(), &mut report).await,
            "claim" => scenario::claim::run(args.scale.clone(), &mut report).await,
            "keys" => scenario::keys::run(args.scale.clone(), &mut report).await,
            "pgq" => scenario::pgq::run(args.scale.clone(), &mut report).await,
            "dashboard" => scenario::dashboard::run(args.scale.clone(), &mut report).await,
            _ => unreachable!("parse_args admits known scenarios only"),
        };
        eprintln!("<== {name} in {:.1} s", started.elapsed().as_secs_f64());
        if let Err(error) = result {
            eprintln!("scenario {name} FAILED: {error}");
            failed.push(name.clone());
        }
    }
    report.print_targets();
    if let Err(error) = plot::draw(&report) {
        eprintln!("plots not written: {error}");
    }
    println!("\nresults: {}", args.out.join("results.jsonl").display());
    if failed.is_empty() {
        0
    } else {
        eprintln!("failed scenarios: {}", failed.join(", "));
        1
    }
}
