#!/usr/bin/env bash
# The multi-process fault run (outbox-chaos): a private PostgreSQL cluster
# and a private redis-server, a producer over 200 keys, 4 relay processes
# SIGKILLed every 1-3 s, Redis stopped, PostgreSQL restarted fast and
# stopped, the consumer killed once, a Redis blip; prints a table and fails
# on any loss, double application or per-key order violation.
#   scripts/chaos.sh           the small run .ci/run makes (5,000 events, ~35 s)
#   scripts/chaos.sh --full    50,000 events, Redis down 10 s, PostgreSQL down 15 s
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p outbox-chaos
target/debug/outbox-chaos run "$@"
