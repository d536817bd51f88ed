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

step "services"
scripts/services.sh

step "cargo fmt --check"
cargo fmt --all --check

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

# Doc tests before nextest: the run then closes on nextest's summary.
step "doc tests"
cargo test --workspace --all-features --doc

step "cargo nextest run (workspace, all features)"
cargo nextest run --workspace --all-features
