#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# What "nbdkit -t 1" costs: the same snapfg server (origin file + a
# persistent snapshot) run with nbdkit's default threads and with -t 1,
# measured with fio's nbd engine at 1 and 4 connections (numjobs), in
# paired rounds: each round runs both thread settings back to back in
# alternating order, and the result is the median over the rounds of the
# per-round ratio -t 1 / default.  (On a shared machine only ratios
# taken close together in time mean anything.)
#
#   contrib/bench/threads-cost.sh [PLUGIN]
#
# Environment: ROUNDS (3), RUNTIME seconds per fio run (10), SIZE_MB
# origin size (256), IODEPTH (16), OUTDIR (a new temporary directory).
# Workloads: snapshot-randread (4 KiB random reads of the snapshot) and
# origin-randwrite (4 KiB random writes to the origin after one full
# pass, so no copy-outs: the per-request path).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
plugin=${1:-$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so}
ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-10}
SIZE_MB=${SIZE_MB:-256}
IODEPTH=${IODEPTH:-16}
OUTDIR=${OUTDIR:-$(mktemp -d /tmp/snapfg-threads-cost.XXXXXX)}
[ -f "$plugin" ] || { echo "threads-cost.sh: no plugin at $plugin (build first)" >&2; exit 1; }
command -v fio >/dev/null && fio --enghelp 2>/dev/null | grep -qw nbd ||
    { echo "threads-cost.sh: fio with the nbd engine is needed (Debian package fio)" >&2; exit 1; }
mkdir -p "$OUTDIR"
log() { echo "threads-cost: $*" >&2; }

sock=$OUTDIR/sock
srv=
stop_server() {
    [ -n "$srv" ] || return 0
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
    srv=
}
trap stop_server EXIT
start_server() {   # start_server THREADS-OPTION...
    rm -f "$sock"
    nbdkit -f -U "$sock" "$@" "$plugin" origin="$OUTDIR/origin.img" cow="$OUTDIR/cow.img" \
        store=persistent chunk-size=4K 2>>"$OUTDIR/nbdkit.log" &
    srv=$!
    for _ in $(seq 300); do [ -S "$sock" ] && return 0; sleep 0.1; done
    echo "threads-cost.sh: nbdkit did not start (see $OUTDIR/nbdkit.log)" >&2
    exit 1
}

log "origin ${SIZE_MB} MiB; a persistent snapshot; one full write pass first"
rm -f "$OUTDIR/cow.img"
head -c $((SIZE_MB * 1024 * 1024)) /dev/urandom >"$OUTDIR/origin.img"
start_server
fio --name=fill --ioengine=nbd --uri="nbd+unix:///origin?socket=$sock" --rw=write --bs=1M \
    --iodepth=8 --size=$((SIZE_MB))M >/dev/null
stop_server

# run WORKLOAD NJ THREADS ROUND: one fio run; prints IOPS.
run() {
    local w=$1 nj=$2 t=$3 r=$4 rw uri opt=() json
    case $w in
        snapshot-randread) rw=randread uri="nbd+unix:///snapshot?socket=$sock" ;;
        origin-randwrite) rw=randwrite uri="nbd+unix:///origin?socket=$sock" ;;
    esac
    [ "$t" = default ] || opt=(-t "$t")
    start_server "${opt[@]}"
    json=$OUTDIR/$w-j$nj-t$t-r$r.json
    sync
    fio --name="$w" --ioengine=nbd --uri="$uri" --rw="$rw" --bs=4k --iodepth="$IODEPTH" \
        --numjobs="$nj" --group_reporting --time_based --runtime="$RUNTIME" \
        --norandommap --randrepeat=0 --output-format=json --output="$json" >/dev/null
    stop_server
    /usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print("%.0f" % (j["read"]["iops"] + j["write"]["iops"]))' "$json"
}

results=$OUTDIR/results.txt
: >"$results"
for ((r = 1; r <= ROUNDS; r++)); do
    for w in snapshot-randread origin-randwrite; do
        for nj in 1 4; do
            # alternate the order from round to round
            if [ $((r % 2)) = 1 ]; then order=(default 1); else order=(1 default); fi
            declare -A iops=()
            for t in "${order[@]}"; do
                la=$(cut -d' ' -f1 /proc/loadavg)
                iops[$t]=$(run "$w" "$nj" "$t" "$r")
                log "round $r $w numjobs=$nj threads=$t: ${iops[$t]} IOPS (loadavg before $la)"
            done
            echo "$w $nj $r ${iops[default]} ${iops[1]} $la" >>"$results"
        done
    done
done

echo "workload connections default_IOPS(median) t1_IOPS(median) ratio_t1/default(median of per-round ratios, min-max)"
/usr/bin/python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    w, nj, r, d, t1, la = line.split()
    rows.setdefault((w, int(nj)), []).append((float(d), float(t1)))
for (w, nj), v in sorted(rows.items()):
    ratios = [t / d for d, t in v]
    print("%-18s %d  %8.0f  %8.0f  %.2f (%.2f-%.2f, %d rounds)" % (
        w, nj, statistics.median(d for d, _ in v), statistics.median(t for _, t in v),
        statistics.median(ratios), min(ratios), max(ratios), len(v)))
EOF
echo "raw results: $results"
