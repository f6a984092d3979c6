#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# What a replay of write-back's held file costs at a start.
#
#   contrib/bench/replay-bench.sh          ("make bench-replay" runs it)
#
# Each round: a persistent snapshot (durability=sync), the committer
# paused (SNAPFG_TEST_WRITEBACK_PAUSE), HELD bytes of first writes of
# WRITE_SIZE held, then kill -9; then the server is started again and
# timed until its socket answers (the replay runs before that), next to
# a start of the same configuration with no held file.  Prints, per
# round and as medians: the start time with and without the replay, the
# time the replay added, and the replay's speed (held bytes / added
# time).  Settings (environment): ROUNDS [3], HELD [the default
# writeback-max less 8M, at most 1000M], WRITE_SIZE [65536],
# SIZE [2G], DIR [a temporary directory under /var/tmp].
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
plugin=${SNAPFG_PLUGIN:-$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so}
PY=${PY:-/usr/bin/python3}
ROUNDS=${ROUNDS:-3}
WRITE_SIZE=${WRITE_SIZE:-65536}
SIZE=${SIZE:-2G}
HELD=${HELD:-1000M}
dir=${DIR:-$(mktemp -d /var/tmp/snapfg-replay-bench.XXXXXX)}
held_dir=$(mktemp -d /dev/shm/snapfg-replay-bench.XXXXXX)
export RUNTIME_DIRECTORY=$held_dir
trap 'rm -rf "$dir" "$held_dir"' EXIT

bytes() { numfmt --from=iec "$1"; }
size=$(bytes "$SIZE")
held=$(bytes "$HELD")
truncate -s "$size" "$dir/origin.img"
# Written once so that the origin's blocks exist (first writes to a
# sparse file would measure the file system's allocation).
dd if=/dev/urandom of="$dir/origin.img" bs=1M count=$((size >> 20)) conv=notrunc status=none

start() {   # start [ENV...]: nbdkit in the background; sets srv
    rm -f "$dir/sock"
    env "$@" nbdkit -f -U "$dir/sock" "$plugin" origin="$dir/origin.img" \
        cow="$dir/cow.img" writeback-max=$((held + 16 * 1024 * 1024)) \
        2>>"$dir/nbdkit.log" &
    srv=$!
}
wait_ready() {  # seconds until the socket answers
    local t0 t1
    t0=$(date +%s.%N)
    until nbdinfo --size "nbd+unix:///?socket=$dir/sock" >/dev/null 2>&1; do
        kill -0 "$srv" 2>/dev/null || { tail "$dir/nbdkit.log" >&2; exit 1; }
        sleep 0.01
    done
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc -l
}
stop() { kill -TERM "$srv"; wait "$srv" 2>/dev/null || true; }

printf '%-6s %12s %12s %12s %10s\n' round start_s replay_start_s added_s GiB/s
added_all=() speed_all=()
for r in $(seq "$ROUNDS"); do
    rm -f "$dir/cow.img"
    # Without a held file.
    start
    plain=$(wait_ready)
    stop
    rm -f "$dir/cow.img"
    # Hold HELD bytes, then crash.
    touch "$dir/pause"
    start SNAPFG_TEST_WRITEBACK_PAUSE="$dir/pause"
    wait_ready >/dev/null
    "$PY" - "nbd+unix:///?socket=$dir/sock" "$held" "$WRITE_SIZE" <<'EOF'
import os, sys, nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
n, ws = int(sys.argv[2]), int(sys.argv[3])
buf = os.urandom(ws)
for off in range(0, n, ws):
    h.pwrite(buf, off)
EOF
    kill -KILL "$srv"; wait "$srv" 2>/dev/null || true
    rm -f "$dir/pause"
    sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
    start
    with=$(wait_ready)
    stop
    added=$(echo "$with - $plain" | bc -l)
    speed=$(echo "$held / 1073741824 / $added" | bc -l)
    added_all+=("$added") speed_all+=("$speed")
    printf '%-6s %12.3f %12.3f %12.3f %10.2f\n' "$r" "$plain" "$with" "$added" "$speed"
    grep -o 'replayed [0-9]* held writes ([0-9]* bytes)' "$dir/nbdkit.log" | tail -n 1
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf 'median: %.3f s added by the replay of %s held in %s writes: %.2f GiB/s\n' \
    "$(median "${added_all[@]}")" "$HELD" "$WRITE_SIZE" "$(median "${speed_all[@]}")"
