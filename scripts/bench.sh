#!/usr/bin/env bash
# The full benchmark set (release build, 3 interleaved rounds per scenario),
# about 25 minutes on 2 cores. Results: target/bench/results.jsonl and PNGs.
#   scripts/bench.sh            the full set
#   scripts/bench.sh --quick    the smoke sizes (what .ci/run runs, in debug)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
# The dashboard scenario runs the `outbox` binary beside the bench.
cargo build --release -p outbox-bench -p outbox-cli
target/release/outbox-bench all "$@"
