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
# Cargo verifies each package against the ones packaged before it through
# a local registry it extracts under $CARGO_HOME/registry/src/-<hash>/,
# the hash of that registry's path: a second run from the same checkout
# path finds the first run's sources there and builds against them
# (stale: "no `judge_crash` in `store`"). Remove our crates' extractions
# (never crates.io's, whose directories are named after the index).
cargo_home=${CARGO_HOME:-$HOME/.cargo}
cargo metadata --format-version 1 --no-deps | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["publish"] != []:
        print(p["name"] + "-" + p["version"])
' | while read -r crate; do
  rm -rf "$cargo_home"/registry/src/-*/"$crate"
done
# --allow-dirty: the README's test command also runs on a working tree.
# shellcheck disable=SC2086
cargo package --workspace $excluded --allow-dirty
for crate in target/package/*.crate; do
  printf '    %s\n' "$(basename "$crate")"
done
