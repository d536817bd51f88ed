#!/usr/bin/env bash
# The README's test command: start/check services, then formatting, lints
# and every test.
#
# Tests run in one `cargo nextest` invocation over the workspace with all
# features (doc tests in one `cargo test --doc`). A test that needs a service
# it cannot reach fails; it never passes silently.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export CARGO_INCREMENTAL=0

step() { printf '\n==> %s\n' "$*"; }

# Before anything is installed: the README's first command (`cargo run
# --example quickstart`) must build on a machine with nothing but a Rust
# toolchain. Proven from the dependency graph it resolves, not by luck.
step "bare machine: the quickstart's and the facade's graphs link no system library"
python3 scripts/check-bare-machine.py

step "services"
scripts/services.sh

step "cargo fmt --check"
cargo fmt --all --check

step "shipped migrations are the templates' rendering (scripts/render-migrations.py leaves no change)"
python3 scripts/render-migrations.py
git diff --exit-code -- outbox-sqlx/migrations outbox-diesel/migrations outbox-diesel/migrations-mysql

step "cargo clippy (all targets, all features, -D warnings)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "build every target once (tests, examples; all features)"
cargo build --workspace --all-features --all-targets

step "examples (smoke: they exit non-zero on any failure)"
target/debug/examples/quickstart > /tmp/outbox-quickstart.log
tail -n 3 /tmp/outbox-quickstart.log
target/debug/examples/billing-postgres > /tmp/outbox-billing.log
tail -n 3 /tmp/outbox-billing.log
target/debug/examples/diesel-billing > /tmp/outbox-diesel-billing.log
tail -n 3 /tmp/outbox-diesel-billing.log
target/debug/examples/diesel-sync > /tmp/outbox-diesel-sync.log
tail -n 3 /tmp/outbox-diesel-sync.log

step "outbox CLI on the quickstart's database (the README's lines)"
quickstart_db="sqlite:${TMPDIR:-/tmp}/outbox-quickstart.db"
target/debug/outbox --url "$quickstart_db" status
failed_id=$(target/debug/outbox --url "$quickstart_db" --output json failed list \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["event_id"])')
target/debug/outbox --url "$quickstart_db" failed show "$failed_id" > /dev/null
target/debug/outbox --url "$quickstart_db" requeue "$failed_id" --reason "CI smoke" --operator ci
target/debug/outbox --url "$quickstart_db" health --max-age 1h --relay-timeout 1h
target/debug/outbox --url "$quickstart_db" purge --older-than 0s

# The benchmark set at smoke sizes, in the debug build made above: it fails
# only if a scenario errors or loses events, never on a missed target.
step "benchmarks (--quick smoke, debug build)"
target/debug/outbox-bench all --quick --out target/bench-smoke

# The multi-process fault run at its small size (private servers of its own).
step "chaos (outbox-chaos run, Redis then Kafka: 5,000 events each, relays SIGKILLed, broker and PostgreSQL stopped)"
target/debug/outbox-chaos run
target/debug/outbox-chaos run --kafka

# The docs as docs.rs and a user's `cargo doc` build them: on stable with
# `--cfg docsrs` (no nightly-only attribute may leak into it), and the
# docs.rs build itself (nightly features behind `outbox_docsrs`; stable
# rustdoc accepts them under RUSTC_BOOTSTRAP, in a target dir of its own so
# the main build's artifacts stay valid).
step "docs (stable, --cfg docsrs, -D warnings)"
RUSTDOCFLAGS="-D warnings --cfg docsrs" cargo doc --workspace --all-features --no-deps
step "docs as docs.rs builds them (feature badges)"
docsrs_crates=$(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if "outbox_docsrs" in json.dumps(p["metadata"] or {}):
        print("-p", p["name"])
')
# shellcheck disable=SC2086
CARGO_TARGET_DIR=target/docsrs RUSTC_BOOTSTRAP=1 \
  RUSTDOCFLAGS="-D warnings --cfg docsrs --cfg outbox_docsrs" \
  cargo doc $docsrs_crates --all-features --no-deps

step "every publishable crate packages and builds alone (cargo package, dependency order)"
scripts/check-packages.sh

# The soak run at its small size: two minutes of production compressed
# (Zipf producers, hot-key bursts, relays killed, paused and redeployed,
# Redis restarted, xmin held, purge on a short schedule), failing on a
# loss, a burned attempt, a history that outgrows retention, a slow status,
# a claim that costs more over time, or other keys held by a hot key.
step "soak (outbox-chaos soak: 2 minutes of traffic, private PostgreSQL and Redis)"
target/debug/outbox-chaos soak

# The tenants soak: one `outbox relay` daemon over 100 tenant schemas for
# two minutes (Zipf traffic, a hot tenant's bursts, a tenant created and
# one dropped every 7 s, a redeploy, purge on a short schedule), failing on
# a loss, a new tenant that does not start, other tenants held back by the
# hot one, a latency or memory that grows, connections above the bound, a
# history that outgrows retention, or /health not counting every tenant.
step "tenants soak (outbox-chaos tenants: 2 minutes, 100 tenant schemas, private PostgreSQL and Redis)"
target/debug/outbox-chaos tenants

# Doc tests before nextest: the run then closes on nextest's summary.
step "doc tests"
cargo test --workspace --all-features --doc

step "cargo nextest run (workspace, all features)"
cargo nextest run --workspace --all-features
