#![doc = include_str!("../README.md")]

mod args;
mod aws;
mod commands;
mod daemon;
mod dashboard;
mod dead_letters;
mod duration;
mod error;
mod render;
mod store;
mod tenants;

use std::process::ExitCode;

use clap::Parser;

use args::Cli;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match commands::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("outbox: {error}");
            error.exit_code()
        }
    }
}
