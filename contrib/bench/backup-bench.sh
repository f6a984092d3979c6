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
#
# Then, in ROUNDS paired rounds (the order alternating), a full backup
# against nbdcopy of the same snapshot export into a raw file, with and
# without --flush (the snapshot made with snapfgctl create, as the
# backup makes its own; a backup always ends with its image durable):
# the medians of the per-round ratios backup / nbdcopy are the figures
# (the goal is at most 1.1).  Beside it, one full backup each with
# --compress (zstd), --compress=zlib and --encrypt: time and image size.
# Environment: SNAPFG_PLUGIN, SNAPFG_BACKUP, SNAPFGCTL (default: this
# tree's builds), CHANGED_PERCENT [5], ROUNDS [5], DATA_PERCENT [62]
# (the part of the disk that holds data; the rest is a hole, as a real
# disk's free space: the issue's 640 MiB of data on 1 GiB).
# SNAPFG_BACKUP_BASELINE: another snapfg-backup build (an older one, to
# measure a change), timed in the same paired rounds as a fourth column
# with its ratio new / baseline.
# WARM_MIB [2048; 0: off]: before each timed copy, that much memory is
# touched and freed (a file in /dev/shm).  In a VM whose balloon reports
# free pages to the host, pages left free for a few seconds go back to
# it, and the next copy's page cache then faults each one in from the
# host: rounds of 3-5 s instead of 0.7, hitting whichever copy came
# after a pause (measured: dd of 640 MiB into a new file, 2.7 s after a
# pause, 0.17 s right after another).  Warming first gives every copy
# the same start.
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
baseline=${SNAPFG_BACKUP_BASELINE:-}
ctl=${SNAPFGCTL:-$top/tools/snapfgctl/snapfgctl}
[ -x "$PWD/tools/snapfgctl/snapfgctl" ] && [ -z "${SNAPFGCTL:-}" ] && ctl=$PWD/tools/snapfgctl/snapfgctl
rounds=${ROUNDS:-5}
data_pct=${DATA_PERCENT:-62}
warm_mib=${WARM_MIB:-2048}
tmp=$(mktemp -d ${TMPDIR:-/var/tmp}/backup-bench.XXXXXX)
pid=
cleanup() {
    [ -z "$pid" ] || { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
    rm -rf "$tmp"
}
trap cleanup EXIT

bytes=$(numfmt --from=iec "$size")
# Data in the first DATA_PERCENT, a hole after it: half of it random,
# half base64 text (6 bits of entropy a byte), so that the compressed
# runs have something to compress.
data_bytes=$((bytes / 100 * data_pct / 2097152 * 2097152))
head -c $((data_bytes / 2)) /dev/urandom >"$tmp/origin.img"
head -c $((data_bytes / 8 * 3)) /dev/urandom | base64 -w 0 | head -c $((data_bytes / 2)) >>"$tmp/origin.img"
truncate -s "$bytes" "$tmp/origin.img"
nbdkit -f -U "$tmp/sock" -P "$tmp/pid" "$plugin" origin="$tmp/origin.img" \
    state="$tmp/origin.state" control="$tmp/ctl" 2>"$tmp/nbdkit.log" &
pid=$!
for _ in $(seq 300); do [ -S "$tmp/ctl" ] && [ -s "$tmp/pid" ] && break; sleep 0.1; done
uri="nbd+unix:///?socket=$tmp/sock"

# warm: touch and free WARM_MIB of memory (see above).
warm() {
    [ "$warm_mib" -gt 0 ] || return 0
    dd if=/dev/zero of=/dev/shm/snapfg-bench-warm.$$ bs=1M count="$warm_mib" status=none
    rm -f /dev/shm/snapfg-bench-warm.$$
}

timed() {   # ARGS... -> seconds on stdout (the build in $run_tool)
    local t0 t1
    sync
    warm
    t0=$(date +%s.%N)
    "${run_tool:-$tool}" -S "$tmp/ctl" -u "$uri" "$@" >>"$tmp/backup.log" 2>&1 ||
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

# --- full backup against nbdcopy of the same snapshot export -----------
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
nbdcopy_round() {   # [--flush]
    local t0 t1
    "$ctl" -S "$tmp/ctl" create bench-snap >/dev/null
    rm -f "$tmp/copy.raw"
    sync
    warm
    t0=$(now)
    nbdcopy "$@" "nbd+unix:///bench-snap?socket=$tmp/sock" "$tmp/copy.raw"
    t1=$(now)
    "$ctl" -S "$tmp/ctl" drop bench-snap >/dev/null
    rm -f "$tmp/copy.raw"
    elapsed "$t0" "$t1"
}
backup_round() {
    local t
    rm -rf "$tmp/round"
    t=$(timed backup "$tmp/round" --full "$@")
    echo "$t"
}
baseline_round() { run_tool=$baseline backup_round; }
ratios=()
fratios=()
bratios=()
echo
if [ -n "$baseline" ]; then
    echo "| round | nbdcopy (s) | nbdcopy --flush (s) | snapfg-backup full (s) | baseline full (s) | / nbdcopy | / nbdcopy --flush | / baseline |"
    echo "|---|---|---|---|---|---|---|---|"
else
    echo "| round | nbdcopy (s) | nbdcopy --flush (s) | snapfg-backup full (s) | / nbdcopy | / nbdcopy --flush |"
    echo "|---|---|---|---|---|---|"
fi
for r in $(seq "$rounds"); do
    to=
    if [ $((r % 2)) -eq 1 ]; then
        tc=$(nbdcopy_round); tf=$(nbdcopy_round --flush)
        [ -z "$baseline" ] || to=$(baseline_round)
        tb=$(backup_round)
    else
        tb=$(backup_round)
        [ -z "$baseline" ] || to=$(baseline_round)
        tf=$(nbdcopy_round --flush); tc=$(nbdcopy_round)
    fi
    ratio=$(awk -v b="$tb" -v c="$tc" 'BEGIN { printf "%.3f", b / c }')
    fratio=$(awk -v b="$tb" -v c="$tf" 'BEGIN { printf "%.3f", b / c }')
    ratios+=("$ratio")
    fratios+=("$fratio")
    if [ -n "$baseline" ]; then
        bratio=$(awk -v b="$tb" -v c="$to" 'BEGIN { printf "%.3f", b / c }')
        bratios+=("$bratio")
        echo "| $r | $tc | $tf | $tb | $to | $ratio | $fratio | $bratio |"
    else
        echo "| $r | $tc | $tf | $tb | $ratio | $fratio |"
    fi
done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo "full backup / nbdcopy of the same snapshot export, median of $rounds paired rounds: $(median "${ratios[@]}")"
echo "full backup / nbdcopy --flush (durable, as a backup is), median: $(median "${fratios[@]}")"
[ -z "$baseline" ] || echo "full backup / the baseline build, median: $(median "${bratios[@]}")"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- compressed and encrypted ------------------------------------------
printf '%s' "bench-key-$$" >"$tmp/key"
chmod 600 "$tmp/key"
echo
echo "| full backup of $size ($data_pct % data) | time (s) | image size (bytes) | allocated (bytes) |"
echo "|---|---|---|---|"
for v in "plain" "--compress" "--compress=zlib" "--encrypt --key-file $tmp/key" \
         "--compress --encrypt --key-file $tmp/key"; do
    # shellcheck disable=SC2086
    if [ "$v" = plain ]; then t=$(backup_round); else t=$(backup_round $v); fi
    # The plain image is sparse (preallocation=metadata): its space is
    # what the blocks take.
    img=$(stat -c %s "$tmp/round"/0001-full.qcow2)
    alloc=$(( $(stat -c '%b * %B' "$tmp/round"/0001-full.qcow2) ))
    echo "| $v | $t | $img | $alloc |"
done
