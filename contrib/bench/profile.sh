#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Profile nbdkit (perf record -g) while fio runs one workload of
# fio-compare.sh against one system: what bounds a number in BENCHMARKS.md.
#
#   contrib/bench/profile.sh SYSTEM WORKLOAD [NUMJOBS]
#
# SYSTEM: bare, snapfg-nosnap, snapfg-transient, snapfg-persistent,
# snapfg-persistent-flush, snapfg-global.  WORKLOAD: origin-randwrite,
# origin-firstwrite, origin-seqfirstwrite, origin-overwrite,
# origin-overwrite-512, snapshot-randread, snapshot-randread-cow,
# snapshot-randwrite (as in fio-compare.sh; the overwrite and -cow
# workloads get a sequential fill pass first).  First-write passes end
# when the disk is covered: give RUNTIME and SIZE so that the pass lasts
# longer than the profile (origin-seqfirstwrite covers 1G in about a
# second here).
#
# Prints fio's IOPS, the top of "perf report --no-children" (self time by
# symbol and by object), nbdkit's CPU time per request (perf stat
# task-clock alone, divided by fio's IOPS), system calls per request by
# kind (perf stat on the syscall tracepoints, which cost CPU of their own;
# requests = replies sent), for snapfg-persistent the
# fdatasync latency and how much of the time one runs, and leaves perf.data and the reports in OUTDIR.
#
# Environment: RUNTIME [10], SIZE [1G], IODEPTH [16], CHUNK_SIZE [4K],
# SNAPFG_PLUGIN, BENCH_DIR [new dir in /var/tmp], OUTDIR
# [bench-results/profile-SYSTEM-WORKLOAD-jN], PERF_FREQ [999],
# PERF_CALLGRAPH [fp; dwarf gives whole stacks through libc, at a cost],
# PERF_TRACE [1: also count system calls], SNAPFG_ARGS [more plugin
# parameters for the snapfg systems, words, e.g. "writeback-max=1G"].
set -euo pipefail
export LC_ALL=C

[ $# -ge 2 ] || { sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
system=$1 workload=$2 nj=${3:-1}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
RUNTIME=${RUNTIME:-10}
SIZE=${SIZE:-1G}
IODEPTH=${IODEPTH:-16}
CHUNK_SIZE=${CHUNK_SIZE:-4K}
PERF_FREQ=${PERF_FREQ:-999}
PERF_CALLGRAPH=${PERF_CALLGRAPH:-fp}
PERF_TRACE=${PERF_TRACE:-1}
SNAPFG_PLUGIN=${SNAPFG_PLUGIN:-$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so}

die() { echo "profile: error: $*" >&2; exit 1; }
log() { echo "profile: $*" >&2; }
for c in nbdkit fio perf; do command -v "$c" >/dev/null || die "'$c' not found"; done

size_bytes=$(numfmt --from=iec "$SIZE")
if [ -n "${BENCH_DIR:-}" ]; then work=$BENCH_DIR; mkdir -p "$work"; made=0
else work=$(mktemp -d "${TMPDIR:-/var/tmp}/snapfg-profile.XXXXXX"); made=1; fi
OUTDIR=${OUTDIR:-$PWD/bench-results/profile-$system-$workload-j$nj}
mkdir -p "$OUTDIR"
origin=$work/origin.img cow=$work/snapshot.cow sock=$work/nbd.sock
pid=

cleanup() {
    local rc=$?
    set +e
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    if [ "$made" = 1 ]; then rm -rf "$work"; else rm -f "$origin" "$cow" "$sock"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

snap=(origin="$origin" cow="$cow" chunk-size="$CHUNK_SIZE")
# shellcheck disable=SC2206 # SNAPFG_ARGS is a list of words on purpose
[ -z "${SNAPFG_ARGS:-}" ] || snap+=(${SNAPFG_ARGS})
case $system in
    bare)              args=(file file="$origin") ;;
    snapfg-nosnap)     args=("$SNAPFG_PLUGIN" origin="$origin") ;;
    snapfg-transient)  args=("$SNAPFG_PLUGIN" "${snap[@]}" store=transient locking=striped) ;;
    snapfg-global)     args=("$SNAPFG_PLUGIN" "${snap[@]}" store=transient locking=global) ;;
    snapfg-persistent) args=("$SNAPFG_PLUGIN" "${snap[@]}" store=persistent locking=striped) ;;
    snapfg-persistent-flush)
                       args=("$SNAPFG_PLUGIN" "${snap[@]}" store=persistent locking=striped durability=flush) ;;
    *) die "unknown system $system" ;;
esac
case $system:$workload in
    bare:*|snapfg-nosnap:*) exp= ;;
    *:snapshot-*) exp=snapshot ;;
    *) exp=origin ;;
esac
uri="nbd+unix:///$exp?socket=$sock"
origin_uri="nbd+unix:///${exp:+origin}?socket=$sock"

log "creating a $SIZE origin in $work"
head -c "$size_bytes" /dev/urandom >"$origin"
rm -f "$cow" "$sock"
nbdkit -f --exit-with-parent -U "$sock" "${args[@]}" 2>"$OUTDIR/nbdkit.log" &
pid=$!
for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || die "nbdkit did not start (see $OUTDIR/nbdkit.log)"

case $workload in
    origin-overwrite|origin-overwrite-512|snapshot-randread-cow)
        log "sequential fill pass (copies every chunk)"
        fio --name=fill --ioengine=nbd --uri="$origin_uri" --rw=write --bs=1M \
            --iodepth=8 --output="$OUTDIR/fill.out" >/dev/null 2>&1 || die "fill pass failed" ;;
esac
bs=4k
opts=(--time_based --runtime="$RUNTIME" --norandommap --randrepeat=0)
case $workload in
    origin-randwrite|origin-overwrite|snapshot-randwrite) rw=randwrite ;;
    origin-overwrite-512) rw=randwrite bs=512 ;;
    snapshot-randread|snapshot-randread-cow) rw=randread ;;
    origin-firstwrite)
        rw=randwrite
        part=$(( size_bytes / nj / 65536 * 65536 ))
        opts=(--norandommap=0 --randrepeat=0 --size="$part" --offset_increment="$part" --runtime="$RUNTIME") ;;
    origin-seqfirstwrite)
        rw=write bs=1M
        part=$(( size_bytes / nj / 1048576 * 1048576 ))
        opts=(--size="$part" --offset_increment="$part" --runtime="$RUNTIME") ;;
    *) die "unknown workload $workload" ;;
esac
sync
qd=$IODEPTH
[ "$workload" != origin-seqfirstwrite ] || qd=${SEQ_IODEPTH:-8}
fio --name="$workload" --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" --iodepth="$qd" \
    --numjobs="$nj" --group_reporting "${opts[@]}" --output="$OUTDIR/fio.out" &
fio_pid=$!
sleep 1
# Two seconds of nbdkit's CPU time with nothing else attached.
perf stat -e task-clock -p "$pid" -o "$OUTDIR/perf-cpu.txt" -- sleep 2 >/dev/null 2>&1 || true
if [ "$PERF_TRACE" = 1 ]; then
    # Two seconds of system call counts by kind (perf stat: counting only,
    # little overhead), divided by fio's IOPS below.
    ev=raw_syscalls:sys_enter
    for sc in pread64 pwrite64 preadv pwritev read write readv writev recvfrom recvmsg \
              sendto sendmsg futex copy_file_range fdatasync membarrier mmap munmap madvise brk; do
        [ ! -d "/sys/kernel/tracing/events/syscalls/sys_enter_$sc" ] || ev="$ev,syscalls:sys_enter_$sc"
    done
    read -r _ u0 n0 s0 i0 w0 q0 sq0 _ </proc/stat
    perf stat -e "task-clock,$ev" -p "$pid" -o "$OUTDIR/perf-stat.txt" -- sleep 2 >/dev/null 2>&1 || true
    read -r _ u1 n1 s1 i1 w1 q1 sq1 _ </proc/stat
    busy=$(( (u1 + n1 + s1 + q1 + sq1) - (u0 + n0 + s0 + q0 + sq0) ))
    idle=$(( (i1 + w1) - (i0 + w0) ))
    echo "machine CPU busy during it: $(( 100 * busy / (busy + idle) ))% of $(nproc) CPUs" >"$OUTDIR/cpu.txt"
fi
if [ -d /sys/kernel/tracing/events/syscalls/sys_enter_fdatasync ] && [ "${system#snapfg-persistent}" != "$system" ]; then
    # Two seconds of fdatasync calls (entry and exit tracepoints): how long
    # each takes and how much of the time one is running.
    perf record -e syscalls:sys_enter_fdatasync,syscalls:sys_exit_fdatasync -p "$pid" \
        -o "$OUTDIR/perf-sync.data" -- sleep 2 2>"$OUTDIR/perf-sync.log" >/dev/null || true
fi
# The profile covers the middle of the run.
dur=$(( RUNTIME > 6 ? RUNTIME - 4 : 1 ))
log "perf record -g -p $pid for ${dur}s"
perf record --call-graph "$PERF_CALLGRAPH" -F "$PERF_FREQ" -p "$pid" -o "$OUTDIR/perf.data" -- sleep "$dur" 2>"$OUTDIR/perf-record.log"
wait "$fio_pid" || die "fio failed (see $OUTDIR/fio.out)"

grep -E '^ *(write|read): IOPS' "$OUTDIR/fio.out" | sed 's/^ */fio: /'
perf report -i "$OUTDIR/perf.data" --no-children --stdio --sort=dso,symbol 2>/dev/null |
    grep -E '^ +[0-9]' | sed 's/ *-  *- *$//' >"$OUTDIR/self.txt" || true
perf report -i "$OUTDIR/perf.data" --no-children --stdio --sort=dso -g none 2>/dev/null |
    grep -E '^ +[0-9]' >"$OUTDIR/dso.txt" || true
perf report -i "$OUTDIR/perf.data" --children --stdio --sort=symbol -g none 2>/dev/null |
    grep -v '^#' | grep -v '^$' >"$OUTDIR/children.txt" || true
echo "## self time by object ($system, $workload, $nj job(s))"
head -n 8 "$OUTDIR/dso.txt"
echo "## self time, top 25 ($system, $workload, $nj job(s))"
head -n 25 "$OUTDIR/self.txt"
iops=$(grep -oE '(write|read): IOPS=[0-9.]+k?' "$OUTDIR/fio.out" | head -1 | sed 's/.*=//')
case $iops in *k) iops=$(awk -v v="${iops%k}" 'BEGIN { printf "%d", v * 1000 }') ;; esac
if [ -s "$OUTDIR/perf-cpu.txt" ] && [ -n "$iops" ] && [ "$iops" -gt 0 ]; then
    awk -v iops="$iops" '{ gsub(",", "", $1) } /task-clock/ {
        printf "nbdkit CPU time: %.1f µs per request (task-clock for 2 s / fio'"'"'s %d IOPS)\n", $1 * 1000 / (2 * iops), iops }' \
        "$OUTDIR/perf-cpu.txt"
fi
if [ -s "$OUTDIR/perf-stat.txt" ]; then
    # Requests served in the window: nbdkit sends one reply per request
    # (one sendto), in bare and in snapfg alike.  (Not pwrite64: a first
    # write in snapfg makes two or three.)
    key=sendto
    echo "## per request (perf stat for 2 s on the syscall tracepoints; requests = $key calls)"
    awk -v key="$key" '{ gsub(",", "", $1) }
        /task-clock/ { cpu = $1 }
        /sys_enter/ { name = $2; sub(/.*sys_enter_?/, "", name); if (name == "") name = "all"
                      if ($1 + 0 > 0) { c[name] = $1; order[++n] = name } }
        END { r = c[key]; if (!r) exit
              printf "requests: %d in 2 s (%.0f per second)\n", r, r / 2
              printf "nbdkit CPU time with the tracepoints on: %.1f µs per request\n", cpu * 1000 / r
              for (k = 1; k <= n; k++) printf "%-18s %8.3f per request\n", order[k], c[order[k]] / r }' \
        "$OUTDIR/perf-stat.txt"
    cat "$OUTDIR/cpu.txt" 2>/dev/null || true
fi
if [ -s "$OUTDIR/perf-sync.data" ]; then
    echo "## fdatasync (perf record on its tracepoints, 2 s)"
    perf script -i "$OUTDIR/perf-sync.data" -F tid,time,event 2>/dev/null |
        awk '{ t = $2; sub(/:$/, "", t); t += 0 }
             /sys_enter_fdatasync/ { start[$1] = t; if (first == "") first = t; last = t }
             /sys_exit_fdatasync/ && ($1 in start) { d = t - start[$1]; n++; sum += d
                                                    if (d > max) max = d; delete start[$1]; last = t }
             END { if (n) printf "%d calls, mean %.0f µs, max %.0f µs, busy %.0f%% of %.2f s\n",
                                 n, sum / n * 1e6, max * 1e6, 100 * sum / (last - first), last - first }'
fi
log "perf data and reports in $OUTDIR"
