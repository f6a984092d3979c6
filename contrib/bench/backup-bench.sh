#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup: an incremental backup against a full one, for a disk
# with 5 % of its 64 KiB granules changed.
#
#   contrib/bench/backup-bench.sh [SIZE]      (default 1G)
#
# Serves a random origin of SIZE with state= and control=, makes a full
# backup (warm-up, and the chain's start), rewrites 5 % of the granules
# (distinct, random), then times the incremental backup of that change
# and, for comparison, a full backup of the same state into a new
# directory.  Prints a table and the ratio incremental / full.
# Environment: SNAPFG_PLUGIN, SNAPFG_BACKUP (default: this tree's
# builds), CHANGED_PERCENT [5].
set -euo pipefail
size=${1:-1G}
pct=${CHANGED_PERCENT:-5}
top=$(cd "$(dirname "$0")/../.." && pwd)
plugin=${SNAPFG_PLUGIN:-$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so}
tool=${SNAPFG_BACKUP:-}
if [ -z "$tool" ]; then
    tool=$top/tools/snapfg-backup/snapfg-backup
    [ -x "$PWD/tools/snapfg-backup/snapfg-backup" ] && tool=$PWD/tools/snapfg-backup/snapfg-backup
fi
tmp=$(mktemp -d)
pid=
cleanup() {
    [ -z "$pid" ] || { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
    rm -rf "$tmp"
}
trap cleanup EXIT

bytes=$(numfmt --from=iec "$size")
head -c "$bytes" /dev/urandom >"$tmp/origin.img"
nbdkit -f -U "$tmp/sock" -P "$tmp/pid" "$plugin" origin="$tmp/origin.img" \
    state="$tmp/origin.state" control="$tmp/ctl" 2>"$tmp/nbdkit.log" &
pid=$!
for _ in $(seq 300); do [ -S "$tmp/ctl" ] && [ -s "$tmp/pid" ] && break; sleep 0.1; done
uri="nbd+unix:///?socket=$tmp/sock"

timed() {   # LABEL ARGS... -> seconds on stdout
    local t0 t1
    sync
    t0=$(date +%s.%N)
    "$tool" -S "$tmp/ctl" -u "$uri" "$@" >>"$tmp/backup.log" 2>&1 ||
        { cat "$tmp/backup.log" >&2; echo "backup-bench: snapfg-backup $* failed" >&2; exit 1; }
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}
field() {   # DIR KEY: the last run's KEY
    /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]+"/manifest.json"))["runs"][-1][sys.argv[2]])' "$1" "$2"
}

t_first=$(timed backup "$tmp/chain")
first_bytes=$(field "$tmp/chain" bytes_copied)
changed=$(/usr/bin/python3 - "$uri" "$bytes" "$pct" <<'PY'
import nbd, os, random, sys
uri, size, pct = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
g = 65536
granules = size // g
n = int(granules * pct / 100)
h = nbd.NBD()
h.connect_uri(uri)
for i in random.Random(1).sample(range(granules), n):
    h.pwrite(os.urandom(g), i * g)
h.flush()
h.shutdown()
print(n * g)
PY
)
t_incr=$(timed backup "$tmp/chain")
t_full=$(timed backup "$tmp/full" --full)
incr_bytes=$(field "$tmp/chain" bytes_copied)
full_bytes=$(field "$tmp/full" bytes_copied)

echo "| backup of a $size disk, $pct % changed | time (s) | bytes copied |"
echo "|---|---|---|"
echo "| first full (chain start) | $t_first | $first_bytes |"
echo "| incremental ($changed bytes changed) | $t_incr | $incr_bytes |"
echo "| full of the same state | $t_full | $full_bytes |"
awk -v i="$t_incr" -v f="$t_full" -v p="$pct" 'BEGIN {
    printf "incremental / full backup time with %s %% changed: %.3f\n", p, (f > 0 ? i / f : 0) }'
