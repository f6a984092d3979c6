#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# First writes with write-back (writeback=on|off): a paired benchmark.
#
#   contrib/bench/writeback-bench.sh      ("make bench-writeback" runs it)
#
# Every round runs every cell once, in a shuffled order; each cell is a
# fresh server (and a fresh, empty COW file) on the same origin file, and
# bare is measured in the same round, so that every ratio pairs two
# measurements taken close together.  Ratios are the median over the
# rounds of the per-round ratio to bare.
#
# Systems:
#   bare         nbdkit file file=ORIGIN
#   wb-on        snapfg, store=persistent (the default store), writeback=on
#   wb-off       snapfg, store=persistent, writeback=off
#   transient    snapfg, store=transient (writeback=on, the default)
#   wb-base      as wb-on, with another build of the plugin
#                (SNAPFG_BASELINE=PATH.so): a change against the one
#                before it, in the same rounds (name it in CELLS)
# Workloads (fio --ioengine=nbd over a Unix socket, numjobs = connections):
#   rand4k       one pass of 4 KiB random first writes, iodepth IODEPTH,
#                each job its own 1/numjobs of the disk (fio's random
#                map), stopped after RUNTIME seconds
#   seq1m        one sequential pass of 1 MiB first writes, iodepth
#                SEQ_IODEPTH, each job its own 1/numjobs of the disk,
#                stopped after RUNTIME seconds
#   flush32      as rand4k with a flush after every 32 writes of a job
#                (fio --fsync=32): flush latency p50/p99
#   randrw       4 KiB random reads and first writes, half each, for
#                RUNTIME seconds (reads of held data: read-your-writes);
#                IOPS are reads and writes together, the latency p50/p99
#                the reads'.  Not in the default CELLS.
# (transient runs seq1m only, the issue's target for it.)
#
# Also the peak memory of each server: its RSS (VmHWM at the end of its
# cell) and the pages of its held file (snapfg-held-* on tmpfs,
# which is not in the RSS), sampled every 0.1 s.
#
# Settings (environment): ROUNDS [5], RUNTIME [10], NUMJOBS ["1 4"],
# SIZE [2G], IODEPTH [16], SEQ_IODEPTH [8], WRITEBACK_MAX [the default],
# BENCH_DIR [a new directory in /var/tmp], OUTDIR [bench-results/wb-DATE],
# CELLS [every cell, "system:workload" words], SNAPFG_PLUGIN.
set -euo pipefail

ROUNDS=${ROUNDS:-5}
RUNTIME=${RUNTIME:-10}
NUMJOBS=${NUMJOBS:-"1 4"}
SIZE=${SIZE:-2G}
IODEPTH=${IODEPTH:-16}
SEQ_IODEPTH=${SEQ_IODEPTH:-8}
top=$(cd "$(dirname "$0")/../.." && pwd)
PLUGIN=${SNAPFG_PLUGIN:-$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so}
OUTDIR=${OUTDIR:-bench-results/wb-$(date -u +%Y%m%d-%H%M%S)}
PY=${PY:-/usr/bin/python3}
CELLS=${CELLS:-"bare:rand4k wb-on:rand4k wb-off:rand4k bare:seq1m wb-on:seq1m wb-off:seq1m transient:seq1m bare:flush32 wb-on:flush32 wb-off:flush32"}

die() { echo "writeback-bench: $*" >&2; exit 1; }
log() { echo "writeback-bench: $*" >&2; }
for c in nbdkit fio shuf "$PY"; do command -v "$c" >/dev/null || die "$c not found"; done
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: run make first"

mkdir -p "$OUTDIR/json"
OUTDIR=$(cd "$OUTDIR" && pwd)
dir=${BENCH_DIR:-$(mktemp -d /var/tmp/snapfg-wb-bench.XXXXXX)}
sock=$dir/sock
origin=$dir/origin.img
cow=$dir/snapshot.cow
srv_pid= sampler_pid=
cleanup() {
    [ -z "$srv_pid" ] || kill "$srv_pid" 2>/dev/null || true
    [ -n "${BENCH_DIR:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT

size_bytes=$(numfmt --from=iec "$SIZE")
log "origin $SIZE of random data in $dir"
head -c "$size_bytes" /dev/urandom >"$origin"

# What the machine charges for what write-back leans on, measured before
# the rounds and printed with the results: a first write holds its data
# in new memory (each page's first touch is a page fault) and copies the
# old data into new blocks of the COW file; bare overwrites the origin's
# blocks through its page cache.  On a virtual machine whose host backs
# memory lazily, or a file system mounted with discard on a thin disk,
# these are far slower than the same work on pages and blocks already in
# use, and they bound the ratios whatever snapfg does.
probe_machine() {
    local t
    "$PY" - <<'PYEOF'
import mmap, time
n = 256 << 20
m = mmap.mmap(-1, n)
t = time.monotonic()
for off in range(0, n, 4096):
    m[off] = 1
first = time.monotonic() - t
t = time.monotonic()
for off in range(0, n, 4096):
    m[off] = 2
again = time.monotonic() - t
print("- new memory: %.2f s per GiB at its first touch (page faults), "
      "%.2f s per GiB touched again" % (first * 4, again * 4))
PYEOF
    t=$(dd if=/dev/zero of="$dir/probe" bs=1M count=256 conv=fdatasync 2>&1 |
        awk '/copied/ { print $(NF-1), $NF }')
    echo "- 256 MiB into a new file and fdatasync: $t"
    t=$(dd if=/dev/zero of="$dir/probe" bs=1M count=256 conv=fdatasync,notrunc 2>&1 |
        awk '/copied/ { print $(NF-1), $NF }')
    echo "- the same blocks overwritten and fdatasync: $t"
    rm -f "$dir/probe"
    echo "- $(findmnt -n -o FSTYPE,OPTIONS --target "$dir" 2>/dev/null | cut -c1-120) ($dir)"
}
probe_machine >"$OUTDIR/machine.txt"
sed "s/^/writeback-bench: machine: /" "$OUTDIR/machine.txt" >&2

start_server() {
    local system=$1 args
    rm -f "$sock" "$cow"
    case $system in
        bare) args=(file "file=$origin") ;;
        wb-on) args=("$PLUGIN" "origin=$origin" "cow=$cow" writeback=on) ;;
        wb-off) args=("$PLUGIN" "origin=$origin" "cow=$cow" writeback=off) ;;
        transient) args=("$PLUGIN" "origin=$origin" "cow=$cow" store=transient) ;;
        wb-base)
            [ -f "${SNAPFG_BASELINE:-}" ] ||
                die "wb-base needs SNAPFG_BASELINE=PATH to a plugin build"
            args=("$SNAPFG_BASELINE" "origin=$origin" "cow=$cow" writeback=on) ;;
        *) die "unknown system $system" ;;
    esac
    if [ -n "${WRITEBACK_MAX:-}" ] && [ "$system" != bare ]; then
        args+=("writeback-max=$WRITEBACK_MAX")
    fi
    nbdkit -f -U "$sock" "${args[@]}" 2>"$OUTDIR/server.log" &
    srv_pid=$!
    for _ in $(seq 300); do
        if [ -S "$sock" ]; then
            sample_held "$srv_pid" "$OUTDIR/held-peak" &
            sampler_pid=$!
            return 0
        fi
        sleep 0.1
    done
    die "$system did not start: $(cat "$OUTDIR/server.log")"
}

# sample_held PID OUT: write the peak KiB of PID's held-data memory file
# to OUT (0 if it has none), until PID is gone.
sample_held() {
    local pid=$1 out=$2 peak=0 fd= f blocks
    echo 0 >"$out"
    while kill -0 "$pid" 2>/dev/null; do
        if [ -z "$fd" ]; then
            for f in /proc/"$pid"/fd/*; do
                case $(readlink "$f" 2>/dev/null) in
                    /memfd:snapfg-held*|*/snapfg-held-*) fd=$f ;;
                esac
            done
        fi
        if [ -n "$fd" ] && blocks=$(stat -L -c %b "$fd" 2>/dev/null) &&
           [ $((blocks / 2)) -gt "$peak" ]; then
            peak=$((blocks / 2))
            echo "$peak" >"$out"
        fi
        sleep 0.1
    done
}

# stop_server: SIGTERM (a clean stop applies what is held) and wait.
# Sets hwm to the peak RSS in KiB and held to the held file's peak.
stop_server() {
    hwm=$(awk '/^VmHWM/ { print $2 }' "/proc/$srv_pid/status" 2>/dev/null || echo 0)
    kill -TERM "$srv_pid"
    wait "$srv_pid" || true
    wait "$sampler_pid" || true
    held=$(cat "$OUTDIR/held-peak" 2>/dev/null || echo 0)
    srv_pid= sampler_pid=
}

results=$OUTDIR/raw.txt
: >"$results"
for round in $(seq "$ROUNDS"); do
    cells=()
    for nj in $NUMJOBS; do
        for c in $CELLS; do cells+=("$c:$nj"); done
    done
    mapfile -t cells < <(printf '%s\n' "${cells[@]}" | shuf)
    for cell in "${cells[@]}"; do
        IFS=: read -r system workload nj <<<"$cell"
        uri="nbd+unix:///?socket=$sock"
        case $workload in
            rand4k|flush32)
                part=$(( size_bytes / nj / 65536 * 65536 ))
                opts=(--rw=randwrite --bs=4k --iodepth="$IODEPTH"
                      --norandommap=0 --randrepeat=0) ;;
            randrw)
                part=$(( size_bytes / nj / 65536 * 65536 ))
                opts=(--rw=randrw --bs=4k --iodepth="$IODEPTH"
                      --randrepeat=0 --time_based) ;;
            seq1m)
                part=$(( size_bytes / nj / 1048576 * 1048576 ))
                opts=(--rw=write --bs=1M --iodepth="$SEQ_IODEPTH") ;;
        esac
        [ "$workload" != flush32 ] || opts+=(--fsync=32)
        json=$OUTDIR/json/$workload-$system-j$nj-r$round.json
        sync
        start_server "$system"
        log "round $round: $workload on $system, $nj job(s) (loadavg $(cut -d' ' -f1 /proc/loadavg))"
        fio --name="$workload" --ioengine=nbd --uri="$uri" "${opts[@]}" \
            --numjobs="$nj" --group_reporting --lat_percentiles=1 \
            --size="$part" --offset_increment="$part" --runtime="$RUNTIME" \
            --output-format=json --output="$json" >/dev/null 2>&1 ||
            die "fio failed: $workload on $system, $nj jobs"
        stop_server
        "$PY" - "$json" "$workload" "$system" "$nj" "$round" "$hwm" "$held" >>"$results" <<'EOF'
import json, sys
path, workload, system, nj, rnd, hwm, held = sys.argv[1:]
j = json.load(open(path))["jobs"][0]
w = j["write"]
iops = w["iops"]
if workload == "seq1m":
    iops = w["bw_bytes"] / 1048576.0
p50 = p99 = 0.0
s = j.get("sync", {}).get("lat_ns", {})
if workload == "randrw":
    iops += j["read"]["iops"]
    s = j["read"].get("clat_ns", {})
pct = s.get("percentile") or {}
if pct:
    p50 = pct.get("50.000000", 0) / 1000.0
    p99 = pct.get("99.000000", 0) / 1000.0
print(workload, system, nj, rnd, "%.1f" % iops, "%.1f" % p50, "%.1f" % p99, hwm, held)
EOF
    done
done

"$PY" - "$results" "$size_bytes" >"$OUTDIR/results.md" <<'EOF'
import sys, statistics
from collections import defaultdict
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
size = int(sys.argv[2])
v = {}
for row in rows:
    wl, system, nj, rnd, iops, p50, p99, hwm = row[:8]
    held = row[8] if len(row) > 8 else "0"      # older raw files: no column
    v[(wl, system, nj, rnd)] = (float(iops), float(p50), float(p99), int(hwm), int(held))
def ratio(wl, system, nj):
    rs = []
    for (w, s, n, r), x in v.items():
        if (w, s, n) == (wl, system, nj) and (wl, "bare", nj, r) in v:
            b = v[(wl, "bare", nj, r)][0]
            if b > 0:
                rs.append(x[0] / b)
    return rs
def med(xs):
    return statistics.median(xs) if xs else float("nan")
njs = sorted({k[2] for k in v}, key=int)
print("| workload | system | conns | median IOPS (MiB/s for seq1m) | median ratio to bare | per-round ratios |")
print("|---|---|---|---|---|---|")
for wl in ("rand4k", "seq1m", "flush32", "randrw"):
    for system in ("bare", "wb-on", "wb-base", "wb-off", "transient"):
        for nj in njs:
            xs = [x[0] for (w, s, n, r), x in v.items() if (w, s, n) == (wl, system, nj)]
            if not xs:
                continue
            rs = ratio(wl, system, nj)
            print("| %s | %s | %s | %.0f | %s | %s |" % (
                wl, system, nj, med(xs),
                "-" if system == "bare" else "%.2f" % med(rs),
                " ".join("%.2f" % r for r in sorted(rs)) if system != "bare" else ""))
# latency_table WORKLOAD TITLE WHAT: p50/p99 medians beside bare's.
def latency_table(wl, title, what):
    print()
    print(title)
    print()
    print("| system | conns | %s p50 us | %s p99 us | p99 / bare p99 |" % (what, what))
    print("|---|---|---|---|---|")
    for system in ("bare", "wb-on", "wb-base", "wb-off"):
        for nj in njs:
            xs = [x for (w, s, n, r), x in v.items() if (w, s, n) == (wl, system, nj)]
            bs = [x for (w, s, n, r), x in v.items() if (w, s, n) == (wl, "bare", nj)]
            if not xs:
                continue
            p99 = med([x[2] for x in xs])
            b99 = med([x[2] for x in bs])
            print("| %s | %s | %.0f | %.0f | %s |" % (system, nj, med([x[1] for x in xs]), p99,
                  "%.2f" % (p99 / b99) if b99 else "-"))
latency_table("flush32", "Flush latency (flush32: a flush after every 32 writes), medians over the rounds:", "flush")
if any(k[0] == "randrw" for k in v):
    latency_table("randrw", "Read latency (randrw), medians over the rounds:", "read")
print()
print("Peak memory of the server, largest over every cell: its RSS (VmHWM)")
print("and its held-data memory file (not in the RSS), in MiB:")
print()
print("| system | workload | peak RSS | peak held file | both |")
print("|---|---|---|---|---|")
for system in ("bare", "wb-on", "wb-base", "wb-off", "transient"):
    for wl in ("rand4k", "seq1m", "flush32", "randrw"):
        xs = [x for (w, s, n, r), x in v.items() if (w, s) == (wl, system)]
        if xs:
            print("| %s | %s | %.0f | %.0f | %.0f |" % (system, wl,
                  max(x[3] for x in xs) / 1024.0, max(x[4] for x in xs) / 1024.0,
                  max(x[3] + x[4] for x in xs) / 1024.0))
EOF
{ echo; echo "The machine, before the rounds:"; echo; cat "$OUTDIR/machine.txt"; } >>"$OUTDIR/results.md"
cat "$OUTDIR/results.md"
log "results in $OUTDIR (raw.txt, results.md, json/)"
