#!/usr/bin/env bash
# The multi-process fault run (outbox-chaos), once with Redis Streams and
# once with Kafka as the broker: a private PostgreSQL cluster and a private
# broker (redis-server with AOF; a tansu broker behind a proxy the run
# cuts), a producer over 200 keys, 4 relay processes SIGKILLed every 1-3 s,
# the broker stopped, PostgreSQL restarted fast and stopped, the consumer
# killed once, a broker blip; prints a table per broker and fails on any
# loss, double application or per-key order violation.
#   scripts/chaos.sh           the small runs .ci/run makes (5,000 events each, ~40 s each)
#   scripts/chaos.sh --full    50,000 events, broker down 10 s, PostgreSQL down 15 s
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p outbox-chaos
target/debug/outbox-chaos run "$@"
target/debug/outbox-chaos run --kafka "$@"
