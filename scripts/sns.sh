#!/usr/bin/env bash
# Installs and starts the SNS/SQS emulator the tests use, on loopback.
#
# Which emulator, and why: there is no Docker (LocalStack's usual home) and
# no network but the package registries. moto's server mode (PyPI, pinned)
# serves SNS and SQS over the real AWS wire protocols on one port, delivers
# SNS to subscribed SQS queues (raw and enveloped), and knows FIFO topics and
# queues, PublishBatch, redrive policies and visibility timeouts. Limits
# (outbox-sns's README): it never throttles or fails by itself (tests inject
# those through a proxy), and it keeps everything in memory.
#
# Idempotent: reuses the venv and an emulator already listening.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${OUTBOX_SNS_PORT:-4566}"
VENV=.tools/moto-venv
LOG=.tools/moto.log
mkdir -p .tools

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import moto.server, flask_cors' 2>/dev/null; then
  "$VENV/bin/pip" install -q --disable-pip-version-check "moto[server,sns,sqs]==5.2.5"
fi
# Tests that need an emulator of their own start this binary.
echo "$PWD/$VENV/bin/moto_server" > .tools/moto-path
if listening; then
  echo "    SNS/SQS emulator already listening on 127.0.0.1:$PORT"
  exit 0
fi
nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" > "$LOG" 2>&1 &
for _ in $(seq 1 150); do
  if listening; then
    echo "    moto SNS/SQS emulator listening on 127.0.0.1:$PORT"
    exit 0
  fi
  sleep 0.2
done
echo "error: moto_server did not start; see $LOG" >&2
cat "$LOG" >&2
exit 1
