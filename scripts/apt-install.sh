#!/usr/bin/env bash
# Installs Debian packages (without recommends) unless installed, and
# refuses if apt would also install or upgrade any postgresql-* or libpq*
# package not named: an upgrade restarts the shared PostgreSQL server.
# Usage: scripts/apt-install.sh PACKAGE...   Idempotent.
set -euo pipefail
say() { printf '    %s\n' "$*"; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep 'ok installed' >/dev/null; }

missing=()
for package in "$@"; do
  installed "$package" || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  say "installed: $*"
  exit 0
fi
plan() { apt-get -s install -y --no-install-recommends "${missing[@]}" 2>/dev/null; }
if ! plan | grep "^Inst ${missing[0]} " >/dev/null; then
  apt-get update -q >/dev/null
fi
named=$(printf '%s\n' "${missing[@]}")
touched=$(plan | awk '/^Inst /{print $2}' | grep -E '^(postgresql|libpq)' | grep -vxF "$named" || true)
if [ -n "$touched" ]; then
  echo "error: installing ${missing[*]} would also install or upgrade: $touched" >&2
  echo "       (that restarts the shared PostgreSQL server; install by hand when safe)" >&2
  exit 1
fi
say "installing ${missing[*]}"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
for package in "${missing[@]}"; do
  installed "$package" || { echo "error: $package did not install" >&2; exit 1; }
done
say "installed: $*"
