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
# Reuses the venv; restarts the emulator on every call, so each test run
# starts from an empty emulator (moto keeps every topic, queue and message
# in memory, and grows slower as they pile up over runs).
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${OUTBOX_SNS_PORT:-4566}"
source scripts/venv.sh
tool_home moto
venv_with "$VENV" 'import moto.server, flask_cors' "moto[server,sns,sqs]==5.2.5"
# moto_server with a fix to FIFO group order after visibility timeouts
# (scripts/moto_server.py says which); tests that need an emulator of their
# own start this launcher too.
cat > .tools/moto-server <<LAUNCHER
#!/usr/bin/env bash
exec "$PWD/$VENV/bin/python" "$PWD/scripts/moto_server.py" "\$@"
LAUNCHER
chmod +x .tools/moto-server
echo "$PWD/.tools/moto-server" > .tools/moto-path
if listening; then
  # Only a moto server this script started (from any checkout) is stopped;
  # anything else on the port is left alone and reported.
  pkill -f "moto_server(\.py)? -H 127\.0\.0\.1 -p $PORT" || true
  for _ in $(seq 1 50); do listening || break; sleep 0.1; done
  if listening; then
    echo "error: 127.0.0.1:$PORT is taken by something other than our moto_server" >&2
    exit 1
  fi
fi
nohup .tools/moto-server -H 127.0.0.1 -p "$PORT" > "$LOG" 2>&1 &
await_listening 150 0.2 "moto SNS/SQS emulator"
