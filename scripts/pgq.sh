#!/usr/bin/env bash
# Installs PgQ (Debian's postgresql-15-pgq3, and pgqd, its ticker daemon)
# for the benchmark's PgQ contenders, unless installed. Refuses to go on if
# apt would install or upgrade anything named postgresql-* besides the PgQ
# package itself: an upgrade restarts the shared server. Idempotent.
set -euo pipefail
say() { printf '    %s\n' "$*"; }

# The server's major version (its binaries' directory), not libpq's.
major=$(ls /usr/lib/postgresql | sort -n | tail -1)
package="postgresql-${major}-pgq3"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep 'ok installed' >/dev/null; }

if installed "$package" && installed pgqd; then
  say "PgQ ($package, pgqd) installed"
  exit 0
fi
plan() { apt-get -s install -y --no-install-recommends "$package" pgqd 2>/dev/null; }
if ! plan | grep "^Inst $package" >/dev/null; then
  apt-get update -q >/dev/null
fi
touched=$(plan | awk '/^Inst /{print $2}' | grep -E '^(postgresql|libpq)' | grep -vx "$package" || true)
if [ -n "$touched" ]; then
  echo "error: installing $package would also install or upgrade: $touched" >&2
  echo "       (that restarts the shared PostgreSQL server; install it by hand when safe)" >&2
  exit 1
fi
say "installing $package and pgqd"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$package" pgqd >/dev/null
installed "$package" || { echo "error: $package did not install" >&2; exit 1; }
say "PgQ ($package, pgqd) installed"
