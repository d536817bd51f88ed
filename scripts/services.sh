#!/usr/bin/env bash
# Makes sure the services the tests need are up on loopback, and resets the
# test databases. Idempotent; safe to run again. PostgreSQL, MariaDB and
# Redis come with the machine; this starts them only if they are down.
set -euo pipefail

PG_URL_HOST=127.0.0.1
say() { printf '    %s\n' "$*"; }

wait_for() { # name, command...
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then say "$name is up"; return 0; fi
    sleep 0.5
  done
  echo "error: $name did not come up" >&2
  return 1
}

# (No `| grep -q` under pipefail: grep quitting early makes the writer die
# of SIGPIPE and the pipeline fail.)
# Tools the tests call: curl (the daemon test scrapes /metrics with it),
# libpq (Diesel's synchronous PgConnection links it; libpq-dev comes with
# the machine and is never installed here: that could upgrade PostgreSQL).
if ! command -v curl >/dev/null; then
  say "installing curl"
  apt-get update -q >/dev/null && apt-get install -y -q curl >/dev/null
fi
ldconfig -p | grep 'libpq\.so' >/dev/null || { echo "error: libpq not installed (libpq-dev)" >&2; exit 1; }
# Diesel's synchronous MysqlConnection links the MariaDB client library the
# machine's MariaDB already uses (libmariadb3); its headers come at exactly
# that version, so nothing the running server depends on is upgraded.
if ! dpkg-query -W -f='${Status}' libmariadb-dev 2>/dev/null | grep 'ok installed' >/dev/null; then
  client=$(dpkg-query -W -f='${Version}' libmariadb3 2>/dev/null) \
    || { echo "error: libmariadb3 (MariaDB's client library) is not installed" >&2; exit 1; }
  say "installing libmariadb-dev=$client"
  apt-get install -y -q --no-upgrade "libmariadb-dev=$client" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-upgrade "libmariadb-dev=$client" >/dev/null; } \
    || { echo "error: libmariadb-dev $client is not available; it must match libmariadb3" >&2; exit 1; }
fi

# PostgreSQL
if ! pg_isready -h "$PG_URL_HOST" -p 5432 >/dev/null 2>&1; then
  say "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi
wait_for PostgreSQL pg_isready -h "$PG_URL_HOST" -p 5432
psql -h "$PG_URL_HOST" -U postgres -d postgres -qX \
  -c "DROP DATABASE IF EXISTS outbox_test WITH (FORCE)" \
  -c "CREATE DATABASE outbox_test" >/dev/null
say "PostgreSQL database outbox_test reset"

# MariaDB / MySQL
if ! mariadb-admin -h 127.0.0.1 -uroot ping >/dev/null 2>&1; then
  say "starting MariaDB"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
fi
wait_for MariaDB mariadb-admin -h 127.0.0.1 -uroot ping
# Tests create one database each (outbox_t_*); drop those of earlier runs.
for db in $(mariadb -h 127.0.0.1 -uroot -N -e "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'outbox\_t\_%'"); do
  mariadb -h 127.0.0.1 -uroot -e "DROP DATABASE \`$db\`"
done
say "MariaDB test databases cleared"

# Redis (the shared one; tests that restart a server start their own)
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  say "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
fi
wait_for Redis redis-cli -h 127.0.0.1 -p 6379 ping
command -v redis-server >/dev/null || { echo "error: redis-server not installed" >&2; exit 1; }

# Kafka-protocol broker (installed and started by the project; see scripts/kafka.sh)
"$(dirname "$0")/kafka.sh"

# SNS/SQS emulator (installed and started by the project; see scripts/sns.sh)
"$(dirname "$0")/sns.sh"

# PgQ for the benchmark's PgQ contenders (installed by the project; see scripts/pgq.sh)
"$(dirname "$0")/pgq.sh"

# Headless Chromium and ChromeDriver for the dashboard's browser tests
# (installed by the project; see scripts/chromium.sh)
"$(dirname "$0")/chromium.sh"
