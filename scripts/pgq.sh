#!/usr/bin/env bash
# Installs PgQ (Debian's postgresql-15-pgq3, and pgqd, its ticker daemon)
# for the benchmark's PgQ contenders, unless installed; nothing else named
# postgresql-* or libpq* may come with it (see apt-install.sh). Idempotent.
set -euo pipefail
# The server's major version (its binaries' directory), not libpq's.
major=$(ls /usr/lib/postgresql | sort -n | tail -1)
"$(dirname "$0")/apt-install.sh" "postgresql-${major}-pgq3" pgqd
