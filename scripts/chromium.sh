#!/usr/bin/env bash
# Installs headless Chromium and ChromeDriver (Debian's chromium and
# chromium-driver) for the dashboard's browser tests, unless installed;
# nothing named postgresql-* or libpq* may come with them (see
# apt-install.sh). Idempotent.
set -euo pipefail
"$(dirname "$0")/apt-install.sh" chromium chromium-driver
chromedriver --version >/dev/null
