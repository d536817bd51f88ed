#!/usr/bin/env bash
# The soak run (outbox-chaos soak): hours of production compressed, with
# private PostgreSQL and Redis of its own. Small by default (about two
# minutes of traffic, as in .ci/run); --full runs 30 minutes and prints the
# table the README quotes; --minutes N sets the length.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "error: redis-server not installed" >&2; exit 1; }
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
  || { echo "error: PostgreSQL server binaries (initdb, pg_ctl) not installed" >&2; exit 1; }
cargo build --release -p outbox-chaos
exec target/release/outbox-chaos soak "$@"
