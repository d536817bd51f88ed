#!/usr/bin/env bash
# Every publishable crate packages and builds from its .crate file alone,
# in dependency order, as `cargo publish` would (cargo verifies each
# package against the ones packaged before it, never against crates.io's).
# The crates marked `publish = false` (bench, chaos, examples, tests) are
# left out; the list comes from the manifests, not from this script.
set -euo pipefail
cd "$(dirname "$0")/.."

excluded=$(cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["publish"] == []:
        print("--exclude", p["name"])
')
rm -f target/package/*.crate
# --allow-dirty: the README's test command also runs on a working tree.
# shellcheck disable=SC2086
cargo package --workspace $excluded --allow-dirty
for crate in target/package/*.crate; do
  printf '    %s\n' "$(basename "$crate")"
done
