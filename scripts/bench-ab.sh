#!/bin/bash
# Alternates two outbox-bench binaries (two builds of the tree) and prints,
# per contender, the median of every round's events/s on each side and
# their ratio B / A.
#
#   scripts/bench-ab.sh BENCH_A BENCH_B SETS SCENARIO [ARGS...]
#   scripts/bench-ab.sh /tmp/bench-before target/release/outbox-bench 5 dialects --only sqlite --rounds 5
#
# Two builds of different trees in one CARGO_TARGET_DIR share artifact
# names: touch the sources of the tree built second.
set -eu
if [ $# -lt 4 ]; then sed -n 2,10p "$0"; exit 2; fi
A=$1; B=$2; SETS=$3; shift 3
out=$(mktemp); : > $out
for i in $(seq 1 $SETS); do for b in $A $B; do $b "$@" --out "${TMPDIR:-/tmp}/bench-ab-out/$i" 2>&1 | grep -E "round [0-9]+ [a-z-]+: [0-9]+ events/s" | sed "s|^|$b |" >> $out; done; done
python3 - $out $A $B <<'PY'
import re,statistics,sys
out,A,B=sys.argv[1:4]
d={}
for l in open(out):
    b=l.split()[0]; k=re.search(r'round \d+ ([a-z-]+):',l).group(1); v=float(re.search(r'(\d+) events/s',l).group(1)); d.setdefault((k,b),[]).append(v)
for k in sorted(set(k for k,_ in d)):
    a=d.get((k,A),[]); b=d.get((k,B),[])
    if a and b: print(f"{k}: {A} median {statistics.median(a):.0f} (n={len(a)}, {min(a):.0f}-{max(a):.0f})  {B} median {statistics.median(b):.0f} (n={len(b)}, {min(b):.0f}-{max(b):.0f})  ratio {statistics.median(b)/statistics.median(a):.3f}")
PY
