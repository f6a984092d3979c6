#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup serve and --limit-rate (issue 31):
#
#   contrib/bench/serve-bench.sh [SIZE]      (default 1G)
#
# 1. First block: a disk of SIZE (random data in its first quarter, the
#    rest a hole) backed up into a qcow2 backup directory and, when the
#    snapfg-repo plugin is built, into a repository; then, for each, the
#    time from starting snapfg-backup serve to the first 4 KiB block read
#    by a client (the goal: under 2 s for 1 GiB), and for the repository
#    the time to read the whole point.
# 2. The rate limit: a restore with --limit-rate RATE (default 20M) of a
#    point big enough for at least 10 s; the measured rate and its
#    distance from the setting (the goal: within 10 %).  Then a backup
#    with it, and with a repository a backup into it and a restore from
#    it (the bytes of data over the run's time).
# Environment: SNAPFG_PLUGIN, SNAPFG_REPO_PLUGIN, SNAPFG_BACKUP (default:
# this tree's builds), RATE [20M].
set -euo pipefail
size=${1:-1G}
rate=${RATE:-20M}
top=$(cd "$(dirname "$0")/../.." && pwd)
plugin=${SNAPFG_PLUGIN:-$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so}
repo_plugin=${SNAPFG_REPO_PLUGIN:-$top/plugins/snapfg-repo/.libs/nbdkit-snapfg-repo-plugin.so}
backup=${SNAPFG_BACKUP:-$top/tools/snapfg-backup/snapfg-backup}
PY=/usr/bin/python3
tmp=$(mktemp -d /var/tmp/serve-bench.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"' EXIT

bytes=$(numfmt --from=iec "$size")
truncate -s "$bytes" "$tmp/disk.img"
"$PY" -c '
import os, sys
f = open(sys.argv[1], "r+b")
left = int(sys.argv[2]) // 4
while left > 0:
    n = min(left, 16 << 20); f.write(os.urandom(n)); left -= n' "$tmp/disk.img" "$bytes"
nbdkit -f -U "$tmp/s.sock" "$plugin" origin="$tmp/disk.img" \
    state="$tmp/st" control="$tmp/ctl" 2>"$tmp/nbdkit.log" &
pids+=($!)
while [ ! -S "$tmp/s.sock" ]; do sleep 0.1; done
u="nbd+unix:///?socket=$tmp/s.sock"
"$backup" backup "$tmp/dirs" --disk vda -S "$tmp/ctl" -u "$u" 2>/dev/null
have_repo=false
if [ -f "$repo_plugin" ] && "$backup" init "$tmp/repo" 2>/dev/null; then
    "$backup" backup "$tmp/repo" --disk vda -S "$tmp/ctl" -u "$u" 2>/dev/null
    have_repo=true
fi

# first_block NAME REPO: seconds from serve to the first block read.
first_block() {
    local s="$tmp/point-$RANDOM.sock" t0 t1 p
    rm -f "$s"
    t0=$(date +%s.%N)
    SNAPFG_REPO_PLUGIN=$repo_plugin "$backup" serve "$2" --disk vda -U "$s" 2>/dev/null &
    p=$!
    "$PY" -c '
import nbd, os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
h = nbd.NBD()
while True:
    try:
        h.connect_uri("nbd+unix:///?socket=" + sys.argv[1]); break
    except nbd.Error:
        time.sleep(0.01)
h.pread(4096, 0)' "$s"
    t1=$(date +%s.%N)
    printf "%-34s %8.2f s\n" "first block, $1" "$(echo "$t1 - $t0" | bc)"
    if [ "$1" = repository ]; then
        t0=$(date +%s.%N)
        nbdcopy "nbd+unix:///?socket=$s" null: 2>/dev/null || true
        t1=$(date +%s.%N)
        printf "%-34s %8.2f s\n" "whole point read, $1" "$(echo "$t1 - $t0" | bc)"
    fi
    kill "$p"; wait "$p" 2>/dev/null || true
}

echo "disk: $size ($((bytes / 4 / 1048576)) MiB of data)"
first_block "qcow2 backup directory" "$tmp/dirs"
$have_repo && first_block repository "$tmp/repo"

# The rate limit over at least 10 s.
rbytes=$(numfmt --from=iec "$rate")
t0=$(date +%s.%N)
"$backup" restore "$tmp/dirs" - --disk vda --limit-rate "$rate" 2>/dev/null |
    head -c $((rbytes * 12)) >/dev/null || true
t1=$(date +%s.%N)
"$PY" -c '
import sys
n, t, want = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
got = n / t
print("%-34s %8.2f MiB/s over %.1f s (set %.2f MiB/s: %+.1f %%)"
      % ("restore --limit-rate " + sys.argv[4], got / 2**20, t, want / 2**20,
         100 * (got - want) / want))' "$((rbytes * 12))" "$(echo "$t1 - $t0" | bc)" "$rbytes" "$rate"
t0=$(date +%s.%N)
"$backup" restore "$tmp/dirs" "$tmp/r.img" --disk vda --limit-rate "$rate" 2>/dev/null
t1=$(date +%s.%N)
"$PY" -c '
import sys
n, t, want = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
got = n / t
print("%-34s %8.2f MiB/s over %.1f s (set %.2f MiB/s: %+.1f %%)"
      % ("restore to a file (+ read-back)", got / 2**20, t, want / 2**20,
         100 * (got - want) / want))' "$((bytes / 4))" "$(echo "$t1 - $t0" | bc)" "$rbytes"
# The copy engine's token bucket: a full backup with --limit-rate (its
# own figure: bytes read over the run's time from the snapshot on).
"$backup" backup "$tmp/limited" -S "$tmp/ctl" -u "$u" --limit-rate "$rate" \
    --json 2>/dev/null | "$PY" -c '
import json, sys
d = json.loads(sys.stdin.read())
got, want = d["rate_bytes_per_s"], int(sys.argv[1])
print("%-34s %8.2f MiB/s over %.1f s (set %.2f MiB/s: %+.1f %%)"
      % ("backup --limit-rate " + sys.argv[2], got / 2**20, d["duration_s"],
         want / 2**20, 100 * (got - want) / want))' "$rbytes" "$rate"
# Into a repository and out of it: the bytes of data (the disk's first
# quarter; its zero chunks are neither read nor fetched) over the run's
# own time.
if $have_repo; then
    "$backup" -S "$tmp/ctl" -u "$u" --json backup "$tmp/repo" --disk vda \
        --full --limit-rate "$rate" 2>/dev/null | "$PY" -c '
import json, sys
d = json.loads(sys.stdin.read().splitlines()[-1])
got, want = d["bytes_read"] / d["seconds"], int(sys.argv[1])
print("%-34s %8.2f MiB/s over %.1f s (set %.2f MiB/s: %+.1f %%)"
      % ("repository backup --limit-rate " + sys.argv[2], got / 2**20,
         d["seconds"], want / 2**20, 100 * (got - want) / want))' "$rbytes" "$rate"
    "$backup" --json restore "$tmp/repo" "$tmp/rr.img" --disk vda \
        --limit-rate "$rate" 2>/dev/null | "$PY" -c '
import json, sys
d = json.loads(sys.stdin.read().splitlines()[-1])
n, want = int(sys.argv[1]), int(sys.argv[2])
got = n / d["seconds"]
print("%-34s %8.2f MiB/s over %.1f s (set %.2f MiB/s: %+.1f %%)"
      % ("repository restore --limit-rate " + sys.argv[3], got / 2**20,
         d["seconds"], want / 2**20, 100 * (got - want) / want))' \
        "$((bytes / 4))" "$rbytes" "$rate"
fi
