#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Compare snapfg with a bare nbdkit file plugin and with its peers (nbdkit's
# cow filter, QEMU copy-before-write fleecing), using fio's nbd engine, and
# check the performance targets of issue 5.
#
#   contrib/bench/fio-compare.sh          ("make bench" runs it)
#
# Builds nothing: it uses the plugin and lock-bench built in the tree.
#
# Systems (each started fresh on a Unix socket, on the same SIZE origin file
# of random data in BENCH_DIR; the fleecing peer makes its own origin of the
# same size in the same directory):
#
#   bare               nbdkit file plugin serving the origin (the limit)
#   snapfg-nosnap      snapfg, no snapshot (no cow=)
#   snapfg-transient   snapfg, store=transient, locking=striped
#   snapfg-persistent  snapfg, store=persistent, locking=striped, run with
#                      nbdkit -v (datapath debugging off) so that the store's
#                      closing line "N exceptions committed in G groups with
#                      S syncs" can be read from its log
#   snapfg-persistent-flush  as snapfg-persistent with durability=flush
#                      (commits synced only at flush/FUA; Invalid after a
#                      power loss); only the first-write servers
#                      (PHASES firstwrite and seqfirst)
#   snapfg-global      snapfg, store=transient, locking=global (one mutex)
#   snapfg-checkpoint  snapfg, no snapshot, one checkpoint tracking
#                      (state= in BENCH_DIR, snapfgctl checkpoint create
#                      right after the start, cbt-granularity= default 64K):
#                      the changed-block tracking overhead of issue 12
#   cow-4K, cow-64K    nbdkit --filter=cow file ORIGIN cow-block-size=4K/64K:
#                      its writes are like writes to a snapshot
#   qemu-fleecing      ../shared/peers/fleecing.sh start: qemu-storage-daemon
#                      with copy-before-write + snapshot-access (64 KiB
#                      copy granularity); skipped with a message when
#                      qemu-storage-daemon (Debian: qemu-system-common) or
#                      the script is missing
#
# Workloads (4 KiB unless named -512; iodepth IODEPTH; time-based for
# RUNTIME seconds except the one-pass first writes):
#
#   origin-randwrite      origin random writes, no snapshot (bare,
#                         snapfg-nosnap, snapfg-checkpoint: with a fresh
#                         checkpoint, so the first write to every granule
#                         also writes the bitmap)
#   origin-firstwrite     fresh snapshot, one pass of random writes in which
#                         every write hits a chunk not yet copied: fio's
#                         random map on (norandommap=0), randrepeat=0, each
#                         job writing its own 1/numjobs of the disk once
#                         (stopped after RUNTIME seconds if the pass is not
#                         over by then).  qemu-fleecing copies 64 KiB, so it
#                         replays one 4 KiB write at a random place in every
#                         64 KiB chunk, chunks in random order, split between
#                         the jobs (fio read_iolog).  bare: the same one-pass
#                         random writes as snapfg.
#   origin-seqfirstwrite  fresh snapshot (a server of its own), one
#                         sequential pass of 1 MiB writes, iodepth
#                         SEQ_IODEPTH, each job writing its own 1/numjobs
#                         of the disk (stopped after RUNTIME seconds if the
#                         pass is not over by then): every write copies out
#                         1 MiB of fresh chunks.  bare: the same pass.
#   origin-overwrite      origin random writes after a sequential 1 MiB pass
#                         has copied every chunk (no copy-out left)
#   origin-overwrite-512  512-byte random writes to the origin on chunks
#                         already copied (the XFS sub-block case); compared
#                         with the 4 KiB overwrite IOPS of the same system
#                         (bare: its 512-byte random writes)
#   snapshot-randread     random reads of a fresh snapshot (routed to the
#                         origin and tracked); bare: random reads of the file
#   snapshot-randread-cow random reads of the snapshot once every chunk is
#                         in the COW store
#   snapshot-randwrite    random writes to a fresh snapshot (snapfg systems
#                         with a snapshot; the cow filter's default export)
#
# Each snapfg system with a snapshot gets, per job count, a fresh server for
# snapshot-randread and origin-firstwrite; a filled one (fill pass) for
# origin-overwrite, origin-overwrite-512 and snapshot-randread-cow (the
# persistent store is filled once and reopened for the other job counts);
# and a fresh one for snapshot-randwrite.  sync runs before every
# measurement.
#
# Every ratio "vs bare" divides by the bare system's IOPS for the same kind
# of I/O (random reads, one-pass random writes, timed 4 KiB or 512-byte
# random writes) with the same number of jobs, measured in this run.
#
# Also runs contrib/bench/lock-bench (the per-CPU lock against
# pthread_rwlock_t and pthread_mutex_t, and their instructions per op under
# callgrind when valgrind is installed) and contrib/bench/startup.sh
# (reopening 1,000,000 exceptions), then prints a table that checks each
# target of issue 5 (met / missed).
#
# Environment (defaults in brackets):
#   RUNTIME        seconds per measurement [10]; RUNTIME=3 for a quick run
#   NUMJOBS        fio job counts (= NBD connections) [1 2 4 8]
#   NUMJOBS_PEERS  job counts for cow-4K, cow-64K and qemu-fleecing
#                  [$NUMJOBS]
#   IODEPTH        fio iodepth per job [16]
#   SEQ_IODEPTH    iodepth of origin-seqfirstwrite [8]
#   PHASES         which servers each snapfg system with a snapshot gets
#                  per job count [firstwrite seqfirst overwrite snapwrite]:
#                  firstwrite = snapshot-randread + origin-firstwrite,
#                  seqfirst = origin-seqfirstwrite, overwrite = the fill
#                  pass + origin-overwrite(-512) + snapshot-randread-cow,
#                  snapwrite = snapshot-randwrite
#   T10_JOBS       job counts of the issue-10 target table [1 4]
#   SIZE           origin size [1G]
#   CHUNK_SIZE     snapfg chunk-size= [4K]
#   SYSTEMS        systems to run [all of the above]
#   LOCKS          1: run the lock microbenchmark [1]
#   LOCK_BENCH_SECONDS  seconds per lock-bench cell [1]
#   STARTUP        1: run startup.sh [1]
#   STARTUP_EXCEPTIONS  exceptions for startup.sh [1000000]
#   BACKUP         1: run backup-bench.sh (snapfg-backup, incremental of
#                  a 5 % change against a full backup) [1]
#   BACKUP_SIZE    disk size for backup-bench.sh [1G]
#   FLEECING_SH    the fleecing peer [../shared/peers/fleecing.sh beside
#                  this tree]
#   SNAPFG_PLUGIN  the plugin [plugins/snapfg/.libs/nbdkit-snapfg-plugin.so
#                  under the current directory, else under this tree]
#   LOCK_BENCH     the lock-bench binary [contrib/bench/lock-bench, likewise]
#   BENCH_DIR      where the origin and COW files go [new dir in /var/tmp]
#   OUTDIR         where results go [bench-results/DATE under the current
#                  directory]: results.md, results.csv, results-iops.png
#                  (with gnuplot), raw.txt, json/, logs/
#   NBDKIT_THREADS nbdkit --threads [nbdkit's default]
#   ROUNDS         rounds [1]: with N > 1 every job count's systems run N
#                  times, round after round (bare, snapfg-nosnap, ...,
#                  then again), and the report gives the median IOPS and
#                  the median of the per-round ratios: each ratio pairs
#                  two measurements of the same round, minutes apart at
#                  most, which cancels most of the machine's drift
#   REPORT_ONLY    1: measure nothing, rebuild the report and the plot from
#                  OUTDIR's raw.txt, persistent.txt, lock-bench.md,
#                  startup.md and meta.sh

set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-1}
NUMJOBS=${NUMJOBS:-"1 2 4 8"}
NUMJOBS_PEERS=${NUMJOBS_PEERS:-$NUMJOBS}
IODEPTH=${IODEPTH:-16}
SEQ_IODEPTH=${SEQ_IODEPTH:-8}
PHASES=${PHASES:-"firstwrite seqfirst overwrite snapwrite"}
has_phase() { [[ " $PHASES " == *" $1 "* ]]; }
SIZE=${SIZE:-1G}
CHUNK_SIZE=${CHUNK_SIZE:-4K}
SYSTEMS=${SYSTEMS:-"bare snapfg-nosnap snapfg-checkpoint snapfg-transient snapfg-persistent snapfg-persistent-flush snapfg-global cow-4K cow-64K qemu-fleecing"}
LOCKS=${LOCKS:-1}
STARTUP=${STARTUP:-1}
STARTUP_EXCEPTIONS=${STARTUP_EXCEPTIONS:-1000000}
BACKUP=${BACKUP:-1}
BACKUP_SIZE=${BACKUP_SIZE:-1G}
FLEECING_SH=${FLEECING_SH:-$top/../shared/peers/fleecing.sh}

die() { echo "fio-compare: error: $*" >&2; exit 1; }
log() { echo "fio-compare: $(date +%H:%M:%S) $*" >&2; }

for c in nbdkit fio; do
    command -v "$c" >/dev/null 2>&1 || die "'$c' not found (apt-get install nbdkit fio)"
done
engines=$(fio --enghelp 2>/dev/null || true)
grep -qw nbd <<<"$engines" || die "this fio has no nbd engine"
if command -v jq >/dev/null 2>&1; then
    json_tool=jq
elif [ -x /usr/bin/python3 ]; then
    json_tool=python
else
    die "need jq or /usr/bin/python3 to read fio's JSON output"
fi

find_built() {   # find_built RELPATH: in the current (build) dir, else the tree
    local p
    for p in "$PWD/$1" "$top/$1"; do
        if [ -e "$p" ]; then echo "$p"; return 0; fi
    done
    return 1
}
SNAPFG_PLUGIN=${SNAPFG_PLUGIN:-$(find_built plugins/snapfg/.libs/nbdkit-snapfg-plugin.so || true)}
[ -n "$SNAPFG_PLUGIN" ] && [ -f "$SNAPFG_PLUGIN" ] ||
    die "plugin not found (build it with make, or set SNAPFG_PLUGIN)"
LOCK_BENCH=${LOCK_BENCH:-$(find_built contrib/bench/lock-bench || true)}
SNAPFGCTL=${SNAPFGCTL:-$(find_built tools/snapfgctl/snapfgctl || true)}

to_bytes() {
    local v=${1^^} n
    n=${v%[KMGT]}
    case $v in
        *K) echo $((n << 10)) ;;
        *M) echo $((n << 20)) ;;
        *G) echo $((n << 30)) ;;
        *T) echo $((n << 40)) ;;
        *) echo "$n" ;;
    esac
}
size_bytes=$(to_bytes "$SIZE")

# Which systems run, and which are skipped (with the reason).
run_systems=
skipped=
for system in $SYSTEMS; do
    case $system in
        bare|snapfg-nosnap|snapfg-checkpoint|snapfg-transient|snapfg-persistent|snapfg-persistent-flush|snapfg-global|cow-4K|cow-64K) ;;
        qemu-fleecing)
            why=
            if ! command -v qemu-storage-daemon >/dev/null 2>&1; then
                why="qemu-storage-daemon is not installed (apt-get install --no-install-recommends qemu-system-common)"
            elif [ ! -f "$FLEECING_SH" ]; then
                why="$FLEECING_SH not found (set FLEECING_SH)"
            fi
            if [ -n "$why" ]; then
                log "skipping qemu-fleecing: $why"
                skipped="$skipped- qemu-fleecing skipped: $why"$'\n'
                continue
            fi
            ;;
        *) die "unknown system $system" ;;
    esac
    run_systems="$run_systems $system"
done
has_system() { [[ " $run_systems " == *" $1 "* ]]; }
has_system bare || die "SYSTEMS must include bare: every ratio is to bare"
numjobs_of() {   # the job counts SYSTEM runs
    case $1 in
        cow-*|qemu-fleecing) echo "$NUMJOBS_PEERS" ;;
        *) echo "$NUMJOBS" ;;
    esac
}

if [ -n "${BENCH_DIR:-}" ]; then
    work=$BENCH_DIR
    mkdir -p "$work"
    made_work=0
else
    work=$(mktemp -d "${TMPDIR:-/var/tmp}/snapfg-bench.XXXXXX")
    made_work=1
fi
work=$(cd "$work" && pwd)
OUTDIR=${OUTDIR:-$PWD/bench-results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUTDIR/json" "$OUTDIR/logs"
OUTDIR=$(cd "$OUTDIR" && pwd)

origin=$work/origin.img
cow=$work/snapshot.cow
pfilled=$work/persistent-filled.cow   # snapfg-persistent's filled store, reopened
sock=$work/nbd.sock
pidfile=$work/nbdkit.pid
server_pid=          # nbdkit, or fleecing.sh (which stops its daemon on TERM)
server_log=
uri_origin='' uri_snapshot=''

stop_server() {
    # Every fio run has finished by now: nbdkit 1.32 does not exit on
    # SIGTERM while clients are connected.
    local pid=$server_pid
    [ -n "$pid" ] || return 0
    server_pid=
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "server $pid did not exit within 30 s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    set +e
    stop_server
    if [ "$made_work" = 1 ]; then
        rm -rf "$work"
    else
        rm -rf "$origin" "$cow" "$pfilled" "$sock" "$pidfile" "$work"/fleecing.* "$work"/cow-tmp \
            "$work"/cbt-state.json "$work"/cbt-state.json.d "$work"/cbt.ctl \
            "$work"/replay-* "$work"/cg.*
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# die_if_server_exited MESSAGE: while a server starts, stop with MESSAGE
# (after its log) if it has already exited.
die_if_server_exited() {
    kill -0 "$server_pid" 2>/dev/null && return 0
    server_pid=
    cat "$server_log" >&2
    die "$1"
}

# start_server SYSTEM TAG [COW]: a server for SYSTEM; sets uri_origin and
# uri_snapshot.  TAG names its log.  Without COW: a new snapshot in a new
# COW file; with COW: that file as it is (a persistent store reopens).
start_server() {
    local system=$1 tag=$2 cow=${3:-$cow} args=() pre=() env=()
    rm -f "$sock" "$pidfile"
    [ -n "${3:-}" ] || rm -f "$cow"
    server_log=$OUTDIR/logs/$system-$tag.log
    if [ "$system" = qemu-fleecing ]; then
        start_fleecing
        return
    fi
    local snap=(origin="$origin" cow="$cow" chunk-size="$CHUNK_SIZE")
    case $system in
        bare)              args=(file file="$origin") ;;
        snapfg-nosnap)     args=("$SNAPFG_PLUGIN" origin="$origin") ;;
        snapfg-checkpoint) rm -rf "$work/cbt-state.json" "$work/cbt-state.json.d"
                           args=("$SNAPFG_PLUGIN" origin="$origin" state="$work/cbt-state.json"
                                 control="$work/cbt.ctl") ;;
        snapfg-transient)  args=("$SNAPFG_PLUGIN" "${snap[@]}" store=transient locking=striped) ;;
        snapfg-global)     args=("$SNAPFG_PLUGIN" "${snap[@]}" store=transient locking=global) ;;
        snapfg-persistent) args=("$SNAPFG_PLUGIN" "${snap[@]}" store=persistent locking=striped)
                           pre=(-v -D nbdkit.backend.datapath=0) ;;
        snapfg-persistent-flush)
                           args=("$SNAPFG_PLUGIN" "${snap[@]}" store=persistent locking=striped durability=flush)
                           pre=(-v -D nbdkit.backend.datapath=0) ;;
        cow-4K|cow-64K)    rm -rf "$work/cow-tmp"; mkdir -p "$work/cow-tmp"
                           env=(TMPDIR="$work/cow-tmp")
                           args=(--filter=cow file file="$origin" cow-block-size="${system#cow-}") ;;
        *) die "unknown system $system" ;;
    esac
    [ -z "${NBDKIT_THREADS:-}" ] || pre+=(--threads "$NBDKIT_THREADS")
    env "${env[@]}" nbdkit -f --exit-with-parent "${pre[@]}" -U "$sock" -P "$pidfile" \
        "${args[@]}" 2>"$server_log" &
    server_pid=$!
    for _ in $(seq 300); do
        if [ -S "$sock" ] && [ -s "$pidfile" ]; then
            case $system in
                bare|cow-*) uri_origin="nbd+unix:///?socket=$sock"; uri_snapshot=$uri_origin ;;
                *) uri_origin="nbd+unix:///origin?socket=$sock"
                   uri_snapshot="nbd+unix:///snapshot?socket=$sock" ;;
            esac
            return 0
        fi
        die_if_server_exited "nbdkit ($system) did not start: nbdkit ${args[*]}"
        sleep 0.1
    done
    die "nbdkit ($system) did not create $sock within 30 s"
}

# start_fleecing: the peer's own script creates its origin and starts
# qemu-storage-daemon; it prints both URIs and waits until it is stopped.
start_fleecing() {
    local out=$OUTDIR/logs/fleecing-uris.txt
    : >"$out"
    bash "$FLEECING_SH" start --size "$SIZE" --workdir "$work" >"$out" 2>"$server_log" &
    server_pid=$!
    for _ in $(seq 1200); do
        uri_origin=$(sed -n 's/^origin .*: \(nbd+unix:.*\)$/\1/p' "$out")
        uri_snapshot=$(sed -n 's/^snapshot .*: \(nbd+unix:.*\)$/\1/p' "$out")
        [ -z "$uri_origin" ] || [ -z "$uri_snapshot" ] || return 0
        die_if_server_exited "fleecing.sh start failed"
        sleep 0.1
    done
    die "fleecing.sh did not print its URIs within 120 s"
}

# start_checkpoint: the running snapfg-checkpoint server starts tracking.
start_checkpoint() {
    [ -n "$SNAPFGCTL" ] && [ -x "$SNAPFGCTL" ] ||
        die "snapfgctl not found (build it with make, or set SNAPFGCTL)"
    for _ in $(seq 100); do [ -S "$work/cbt.ctl" ] && break; sleep 0.1; done
    "$SNAPFGCTL" -S "$work/cbt.ctl" checkpoint create bench >/dev/null ||
        die "snapfgctl checkpoint create failed"
}

# persistent_stats: "EXCEPTIONS GROUPS SYNCS [CALLS]" from the store's
# closing debug line in the (stopped) server's log (CALLS: commit calls,
# one per batch of copy-outs; older plugins do not print it).
persistent_stats() {
    sed -n 's/.* \([0-9][0-9]*\) exceptions committed in \([0-9][0-9]*\) groups with \([0-9][0-9]*\) syncs\( (\([0-9][0-9]*\) commit calls)\)\{0,1\}.*/\1 \2 \3 \5/p' \
        "$server_log" | tail -n 1
}

# parse_json FILE: "IOPS MEAN_US P99_US TOTAL_IOS" of the job group's
# reads or writes.
parse_json() {
    if [ "$json_tool" = jq ]; then
        jq -r '.jobs[0] as $j
               | (if $j.write.total_ios > 0 then $j.write else $j.read end) as $d
               | [ ($d.iops * 100 | round / 100),
                   ($d.lat_ns.mean / 10 | round / 100),
                   ((($d.lat_ns.percentile // $d.clat_ns.percentile)["99.000000"] // 0) / 10 | round / 100),
                   $d.total_ios ]
               | map(tostring) | join(" ")' "$1"
    else
        /usr/bin/python3 - "$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
d = j["write"] if j["write"]["total_ios"] > 0 else j["read"]
pct = d["lat_ns"].get("percentile") or d["clat_ns"].get("percentile") or {}
print("%.2f %.2f %.2f %d" % (d["iops"], d["lat_ns"]["mean"] / 1000,
                             pct.get("99.000000", 0) / 1000, d["total_ios"]))
PY
    fi
}

# replay_jobfile NJ URI: a fio job file replaying, split over NJ jobs, one
# 4 KiB write at a random 4 KiB offset of every 64 KiB chunk of the origin,
# chunks in random order (every write is a first write for a 64 KiB COW).
replay_jobfile() {
    local nj=$1 uri=$2 jf=$work/replay-$1.fio j
    awk -v chunks=$(( size_bytes / 65536 )) -v nj="$nj" -v dir="$work" 'BEGIN {
        srand(1);
        for (i = 0; i < chunks; i++) c[i] = i;
        for (i = chunks - 1; i > 0; i--) {      # Fisher-Yates shuffle
            k = int(rand() * (i + 1)); t = c[i]; c[i] = c[k]; c[k] = t
        }
        for (j = 0; j < nj; j++) {
            f[j] = dir "/replay-" nj "-" j ".log"
            print "fio version 2 iolog\nnbd add\nnbd open" > f[j]
        }
        for (i = 0; i < chunks; i++)
            printf "nbd write %d 4096\n", c[i] * 65536 + int(rand() * 16) * 4096 > f[i % nj]
        for (j = 0; j < nj; j++) { print "nbd close" > f[j]; close(f[j]) }
    }'
    {
        printf '[global]\nioengine=nbd\nuri=%s\niodepth=%s\nreplay_no_stall=1\n' "$uri" "$IODEPTH"
        printf 'group_reporting=1\nlat_percentiles=1\nruntime=%s\n' "$RUNTIME"
        for ((j = 0; j < nj; j++)); do
            printf '[firstwrite%d]\nread_iolog=%s/replay-%d-%d.log\n' "$j" "$work" "$nj" "$j"
        done
    } >"$jf"
    echo "$jf"
}

# run_fio SYSTEM WORKLOAD NJ: one measurement; appends a result line
# "WORKLOAD SYSTEM NJ IOPS MEAN_US P99_US TOTAL_IOS LOADAVG ROUND" to
# $results (round = $round).
results=$OUTDIR/raw.txt
round=1
run_fio() {
    local system=$1 workload=$2 nj=$3 rw bs=4k mode=timed uri json opts
    case $workload in
        origin-randwrite|origin-overwrite) rw=randwrite uri=$uri_origin ;;
        origin-randwrite-512|origin-overwrite-512) rw=randwrite bs=512 uri=$uri_origin ;;
        origin-firstwrite) rw=randwrite mode=onepass uri=$uri_origin
                           [ "$system" != qemu-fleecing ] || mode=replay ;;
        origin-seqfirstwrite) rw=write bs=1M mode=seqpass uri=$uri_origin ;;
        snapshot-randread|snapshot-randread-cow) rw=randread uri=$uri_snapshot ;;
        snapshot-randwrite) rw=randwrite uri=$uri_snapshot ;;
        *) die "unknown workload $workload" ;;
    esac
    json=$OUTDIR/json/$workload-$system-j$nj-r$round.json
    opts=(--output-format=json --output="$json")
    case $mode in
        onepass)
            # Each job writes its own 1/nj of the disk, each block once
            # (fio's random map), stopping early after RUNTIME seconds.
            local part=$(( size_bytes / nj / 65536 * 65536 ))
            opts+=(--name="$workload" --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs"
                   --iodepth="$IODEPTH" --numjobs="$nj" --group_reporting
                   --lat_percentiles=1 --norandommap=0 --randrepeat=0
                   --size="$part" --offset_increment="$part" --runtime="$RUNTIME") ;;
        seqpass)
            # Each job writes its own 1/nj of the disk once, in order.
            local part=$(( size_bytes / nj / 1048576 * 1048576 ))
            opts+=(--name="$workload" --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs"
                   --iodepth="$SEQ_IODEPTH" --numjobs="$nj" --group_reporting
                   --lat_percentiles=1 --size="$part" --offset_increment="$part"
                   --runtime="$RUNTIME") ;;
        replay)
            opts+=("$(replay_jobfile "$nj" "$uri")") ;;
        timed)
            opts+=(--name="$workload" --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs"
                   --iodepth="$IODEPTH" --numjobs="$nj" --group_reporting
                   --lat_percentiles=1 --time_based --runtime="$RUNTIME"
                   --norandommap --randrepeat=0) ;;
    esac
    # Dirty pages of earlier runs are written back now, not during this one.
    sync
    local la
    la=$(cut -d' ' -f1 /proc/loadavg)
    log "$workload on $system, $nj job(s), round $round (loadavg $la)"
    fio "${opts[@]}" >"${json%.json}.out" 2>&1 ||
        { cat "${json%.json}.out" >&2
          die "fio failed: $workload on $system with $nj job(s)"; }
    local line
    line=$(parse_json "$json") || die "cannot read $json"
    echo "$workload $system $nj $line $la $round" >>"$results"
}

# fill_pass SYSTEM NJ: write the whole origin once, sequentially (1 MiB), so
# that every chunk is copied out.
fill_pass() {
    local out=$OUTDIR/json/fill-$1-j$2-r$round.out
    sync
    log "full sequential pass over the origin ($1)"
    fio --name=fill --ioengine=nbd --uri="$uri_origin" \
        --rw=write --bs=1M --iodepth=8 --numjobs=1 --output="$out" >/dev/null 2>&1 ||
        { cat "$out" >&2; die "the full pass failed on $1"; }
}

# record_persistent NJ PHASE: after stopping a persistent server, a line
# "NJ PHASE EXCEPTIONS GROUPS SYNCS CALLS SYSTEM" (older files: no
# SYSTEM, meaning snapfg-persistent).
pstats=$OUTDIR/persistent.txt
record_persistent() {
    local s
    s=$(persistent_stats)
    if [ -n "$s" ]; then
        read -r -a f <<<"$s"
        echo "$1 $2 ${f[0]} ${f[1]} ${f[2]} ${f[3]:-0} $system" >>"$pstats"
    else
        log "warning: no 'exceptions committed' line in $server_log"
    fi
}

# --- run ----------------------------------------------------------------
t_start=$(date +%s)
if [ "${REPORT_ONLY:-0}" = 1 ]; then
    # Rebuild the report from OUTDIR's raw.txt, persistent.txt,
    # lock-bench.md and startup.md.
    [ -s "$OUTDIR/raw.txt" ] || die "REPORT_ONLY=1: no $OUTDIR/raw.txt"
    results=$OUTDIR/raw.txt pstats=$OUTDIR/persistent.txt
    lockmd=$OUTDIR/lock-bench.md startmd=$OUTDIR/startup.md
    load_at_start='?' t_fio=$t_start t_end=$t_start
    # The run's settings and times (shell assignments).
    # shellcheck disable=SC1091
    [ ! -f "$OUTDIR/meta.sh" ] || . "$OUTDIR/meta.sh"
else

load_at_start=$(cut -d' ' -f1-3 /proc/loadavg)
log "plugin $SNAPFG_PLUGIN"
log "work dir $work, results in $OUTDIR"
log "systems:$run_systems; jobs $NUMJOBS (peers: $NUMJOBS_PEERS); ${RUNTIME}s per run; $ROUNDS round(s)"
log "load average before the run: $load_at_start"
if awk -v l="${load_at_start%% *}" 'BEGIN { exit !(l > 1.0) }'; then
    log "warning: the machine is not idle: the numbers will be noisy"
fi
: >"$results"
: >"$pstats"
log "creating a $SIZE origin"
head -c "$size_bytes" /dev/urandom >"$origin"

for nj in $NUMJOBS; do
  for round in $(seq "$ROUNDS"); do
    for system in $run_systems; do
        [[ " $(numjobs_of "$system") " == *" $nj "* ]] || continue
        case $system in
            bare)
                start_server bare "j$nj"
                run_fio bare snapshot-randread "$nj"
                run_fio bare origin-firstwrite "$nj"
                run_fio bare origin-seqfirstwrite "$nj"
                run_fio bare origin-randwrite "$nj"
                run_fio bare origin-randwrite-512 "$nj"
                stop_server
                ;;
            snapfg-nosnap)
                start_server "$system" "j$nj"
                run_fio "$system" origin-randwrite "$nj"
                stop_server
                ;;
            snapfg-checkpoint)
                # A new checkpoint: nothing marked yet.
                start_server "$system" "j$nj"
                start_checkpoint
                run_fio "$system" origin-randwrite "$nj"
                stop_server
                ;;
            cow-*)
                start_server "$system" "j$nj"
                run_fio "$system" snapshot-randwrite "$nj"
                stop_server
                ;;
            qemu-fleecing)
                start_server "$system" "j$nj"
                run_fio "$system" snapshot-randread "$nj"
                run_fio "$system" origin-firstwrite "$nj"
                fill_pass "$system" "$nj"
                run_fio "$system" origin-overwrite "$nj"
                run_fio "$system" snapshot-randread-cow "$nj"
                stop_server
                ;;
            snapfg-*)
                # A fresh snapshot for the reads routed to the origin and
                # the random first writes ...
                is_persistent=0
                [[ $system != snapfg-persistent* ]] || is_persistent=1
                if has_phase firstwrite; then
                    start_server "$system" "firstwrite-j$nj"
                    run_fio "$system" snapshot-randread "$nj"
                    run_fio "$system" origin-firstwrite "$nj"
                    stop_server
                    [ "$is_persistent" = 0 ] || record_persistent "$nj" firstwrite
                fi
                # ... one for the sequential first writes ...
                if has_phase seqfirst; then
                    start_server "$system" "seqfirst-j$nj"
                    run_fio "$system" origin-seqfirstwrite "$nj"
                    stop_server
                    [ "$is_persistent" = 0 ] || record_persistent "$nj" seqfirstwrite
                fi
                # ... another, filled, for the remapped paths (the
                # persistent store is filled once, then reopened: its fill
                # pass commits every exception) ...
                if has_phase overwrite && [ "$system" != snapfg-persistent-flush ]; then
                    if [ "$system" != snapfg-persistent ]; then
                        start_server "$system" "overwrite-j$nj"
                        fill_pass "$system" "$nj"
                    elif [ -f "$pfilled" ]; then
                        start_server "$system" "overwrite-j$nj" "$pfilled"
                    else
                        start_server "$system" "overwrite-j$nj" "$pfilled"
                        fill_pass "$system" "$nj"
                    fi
                    run_fio "$system" origin-overwrite "$nj"
                    run_fio "$system" origin-overwrite-512 "$nj"
                    run_fio "$system" snapshot-randread-cow "$nj"
                    stop_server
                    [ "$is_persistent" = 0 ] || record_persistent "$nj" fill+overwrite
                fi
                # ... and a fresh one for writes to the snapshot.
                if has_phase snapwrite && [ "$system" != snapfg-persistent-flush ]; then
                    start_server "$system" "snapwrite-j$nj"
                    run_fio "$system" snapshot-randwrite "$nj"
                    stop_server
                    [ "$is_persistent" = 0 ] || record_persistent "$nj" snapshot-randwrite
                fi
                ;;
        esac
    done
  done
done
rm -f "$cow"
t_fio=$(date +%s)

# --- lock microbenchmark and start-up time --------------------------------
# The timing table of contrib/bench/lock-bench (what lock-bench.sh prints
# first), then callgrind instructions per read lock + unlock: two runs with
# fixed iteration counts, the difference of each function's inclusive cost
# divided by the difference of iterations (start-up costs cancel out).
lock_bench() {
    echo "### Read-side acquire+release, ns per op per thread ($(nproc) CPUs, ${LOCK_BENCH_SECONDS:-1} s per cell)"
    echo
    "$LOCK_BENCH" "${LOCK_BENCH_SECONDS:-1}"
    command -v valgrind >/dev/null 2>&1 && command -v callgrind_annotate >/dev/null 2>&1 || return 0
    local iters fn a b
    for iters in 100000 200000; do
        LOCK_BENCH_ITERS=$iters valgrind --tool=callgrind --callgrind-out-file="$work/cg.$iters" \
            "$LOCK_BENCH" 0 1 >/dev/null 2>&1 || return 0
        callgrind_annotate --auto=no --inclusive=yes --threshold=100 "$work/cg.$iters" \
            >"$work/cg.$iters.txt" 2>/dev/null || return 0
    done
    echo
    echo "### Instructions per read lock + unlock (callgrind, 1 thread, inclusive)"
    echo
    echo "| function | instructions/op |"
    echo "|---|---:|"
    for fn in percpu_rwlock_read_lock percpu_rwlock_read_unlock pthread_rwlock_rdlock \
              pthread_rwlock_unlock pthread_mutex_lock pthread_mutex_unlock; do
        a=$(awk -v f="$fn" '$0 ~ (":" f "[@ ]") { gsub(",", "", $1); print $1; exit }' "$work/cg.100000.txt")
        b=$(awk -v f="$fn" '$0 ~ (":" f "[@ ]") { gsub(",", "", $1); print $1; exit }' "$work/cg.200000.txt")
        [ -z "$a" ] || [ -z "$b" ] || echo "| $fn | $(( (b - a) / 100000 )) |"
    done
    rm -f "$work"/cg.*
}
lockmd=$OUTDIR/lock-bench.md
: >"$lockmd"
if [ "$LOCKS" = 1 ]; then
    if [ -n "$LOCK_BENCH" ] && [ -x "$LOCK_BENCH" ]; then
        log "lock microbenchmark ($LOCK_BENCH)"
        lock_bench >"$lockmd" 2>"$OUTDIR/logs/lock-bench.log" ||
            log "warning: the lock microbenchmark failed (see $OUTDIR/logs/lock-bench.log)"
    else
        log "warning: contrib/bench/lock-bench not built (make); no lock microbenchmark"
    fi
fi
startmd=$OUTDIR/startup.md
: >"$startmd"
if [ "$STARTUP" = 1 ]; then
    log "start-up time with $STARTUP_EXCEPTIONS exceptions (startup.sh)"
    SNAPFG_PLUGIN=$SNAPFG_PLUGIN TMPDIR=$work bash "$here/startup.sh" "$STARTUP_EXCEPTIONS" \
        >"$startmd" 2>"$OUTDIR/logs/startup.log" ||
        log "warning: startup.sh failed (see $OUTDIR/logs/startup.log)"
fi
backupmd=$OUTDIR/backup.md
: >"$backupmd"
if [ "$BACKUP" = 1 ]; then
    log "snapfg-backup: incremental (5 % changed) against full, $BACKUP_SIZE (backup-bench.sh)"
    SNAPFG_PLUGIN=$SNAPFG_PLUGIN TMPDIR=$work bash "$here/backup-bench.sh" "$BACKUP_SIZE" \
        >"$backupmd" 2>"$OUTDIR/logs/backup-bench.log" ||
        log "warning: backup-bench.sh failed (see $OUTDIR/logs/backup-bench.log)"
fi
t_end=$(date +%s)
for v in RUNTIME ROUNDS NUMJOBS NUMJOBS_PEERS IODEPTH SEQ_IODEPTH PHASES SIZE CHUNK_SIZE run_systems skipped \
         STARTUP_EXCEPTIONS load_at_start t_start t_fio t_end; do
    printf '%s=%q\n' "$v" "${!v}"
done >"$OUTDIR/meta.sh"
fi   # REPORT_ONLY

# --- report ---------------------------------------------------------------
# bare_of WORKLOAD: the bare measurement WORKLOAD is compared with.
bare_of() {
    case $1 in
        origin-randwrite|origin-overwrite|snapshot-randwrite) echo origin-randwrite ;;
        origin-randwrite-512|origin-overwrite-512) echo origin-randwrite-512 ;;
        origin-firstwrite) echo origin-firstwrite ;;
        origin-seqfirstwrite) echo origin-seqfirstwrite ;;
        snapshot-randread|snapshot-randread-cow) echo snapshot-randread ;;
    esac
}
bare_label() {
    case $(bare_of "$1") in
        origin-randwrite) echo "bare (4K randwrite)" ;;
        origin-randwrite-512) echo "bare (512 randwrite)" ;;
        origin-firstwrite) echo "bare (one-pass randwrite)" ;;
        origin-seqfirstwrite) echo "bare (1 MiB sequential writes)" ;;
        snapshot-randread) echo "bare (randread)" ;;
    esac
}
# get WORKLOAD SYSTEM NJ [FIELD]: a measured value (FIELD 4 = IOPS), the
# median over the rounds (the lower middle one of an even count).
get() {
    awk -v w="$1" -v s="$2" -v n="$3" -v f="${4:-4}" \
        '$1 == w && $2 == s && $3 == n { print $f }' "$results" |
        sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}
ratio() {
    awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else printf "n/a" }'
}
# pratio W1 S1 W2 S2 NJ: IOPS of W1 on S1 divided by IOPS of W2 on S2, both
# with NJ jobs and measured in the same round; the median over the rounds
# that measured both ("n/a" when none did).  Lines of a raw.txt written
# before rounds existed count as round 1.
pratio() {
    awk -v w1="$1" -v s1="$2" -v w2="$3" -v s2="$4" -v n="$5" '
        $3 != n { next }
        { r = ($9 == "" ? 1 : $9) }
        $1 == w1 && $2 == s1 && !(r in a) { a[r] = $4 }
        $1 == w2 && $2 == s2 && !(r in b) { b[r] = $4 }
        END { for (r in a) if ((r in b) && a[r] > 0 && b[r] > 0) print a[r] / b[r] }' "$results" |
        sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", v[int((NR + 1) / 2)]; else printf "n/a" }'
}

WORKLOADS="origin-randwrite origin-firstwrite origin-seqfirstwrite origin-overwrite origin-overwrite-512 snapshot-randread snapshot-randread-cow snapshot-randwrite"
ALLJOBS=$(printf '%s\n' $NUMJOBS $NUMJOBS_PEERS | sort -n -u | tr '\n' ' ')
csv=$OUTDIR/results.csv
md=$OUTDIR/results.md
fs_type=$(df -T "$work" | awk 'NR == 2 { print $2 }')
qsd_version=$(qemu-storage-daemon --version 2>/dev/null | head -n 1 || true)

echo "workload,system,numjobs,iodepth,bs,runtime_s,iops,lat_mean_us,lat_p99_us,total_ios,loadavg1,bare_workload,bare_iops,iops_vs_bare,round" >"$csv"
while read -r w s n iops mean p99 ios la rnd; do
    b=$(bare_of "$w")
    rnd=${rnd:-1}
    base=$(awk -v w="$b" -v n="$n" -v r="$rnd" \
               '$1 == w && $2 == "bare" && $3 == n && ($9 == "" ? 1 : $9) == r { print $4; exit }' "$results")
    bs=4k
    [[ $w != *-512 ]] || bs=512
    [ "$w" != origin-seqfirstwrite ] || bs=1M
    echo "$w,$s,$n,$IODEPTH,$bs,$RUNTIME,$iops,$mean,$p99,$ios,$la,$b,${base:-},$(ratio "$iops" "$base"),$rnd" >>"$csv"
done <"$results"

{
    echo "# snapfg fio comparison"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); fio part $(( (t_fio - t_start) / 60 )) min, whole run $(( (t_end - t_start) / 60 )) min"
    echo "- host: $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)), $(free -g | awk '/^Mem:/ {print $2}') GiB RAM, kernel $(uname -r); bench dir on $fs_type; load average before the run: $load_at_start"
    echo "- $(nbdkit --version | head -n 1), $(fio --version)${qsd_version:+, $qsd_version}"
    echo "- plugin: $SNAPFG_PLUGIN"
    echo "- origin: $SIZE file of random data (page cache), snapfg chunk-size=$CHUNK_SIZE; fleecing: its own $SIZE origin, 64 KiB copies"
    echo "- fio: --ioengine=nbd over a Unix socket, 4 KiB (512 B for -512), iodepth=$IODEPTH, numjobs = connections, ${RUNTIME}s per row (first writes: one pass, at most ${RUNTIME}s); origin-seqfirstwrite: 1 MiB sequential writes, iodepth=${SEQ_IODEPTH:-8}, one pass (IOPS = MiB/s)"
    echo "- modes: snapfg-persistent is the default store (store=persistent, durability=sync: crash-safe, every exception durable before its origin write); snapfg-persistent-flush is store=persistent durability=flush (opt-in: synced at flush/FUA, Invalid after a power loss); snapfg-transient is store=transient (exceptions in memory only)"
    if [ "$ROUNDS" -gt 1 ]; then
        echo "- $ROUNDS rounds, each running every system once per job count: IOPS are medians over the rounds, every ratio the median of the ratios of the two measurements made in the same round"
    fi
    printf '%s' "$skipped"
    echo
    echo "## IOPS by connections (ratio to bare in brackets)"
    echo
    printf '| workload | system |'; for nj in $ALLJOBS; do printf ' %s |' "$nj"; done; echo
    printf '|---|---|'; for nj in $ALLJOBS; do printf -- '---:|'; done; echo
    for workload in $WORKLOADS; do
        for system in $run_systems; do
            row='' any=0
            for nj in $ALLJOBS; do
                if [ "$system" = bare ]; then
                    [ "$workload" = "$(bare_of "$workload")" ] || continue 2
                    iops=$(get "$workload" bare "$nj") r=
                else
                    iops=$(get "$workload" "$system" "$nj")
                    r=" ($(pratio "$workload" "$system" "$(bare_of "$workload")" bare "$nj"))"
                fi
                if [ -n "$iops" ]; then
                    any=1
                    row="$row $(printf '%.0f' "$iops")$r |"
                else
                    row="$row – |"
                fi
            done
            [ "$any" = 0 ] || echo "| $workload | $system |$row"
        done
    done
    echo
    echo "bare's rows: origin-randwrite is its 4 KiB random writes, the baseline of"
    echo "origin-overwrite and snapshot-randwrite too; snapshot-randread its random"
    echo "reads, the baseline of snapshot-randread-cow too; origin-overwrite-512 is"
    echo "compared with bare's 512-byte random writes: $(for nj in $ALLJOBS; do v=$(get origin-randwrite-512 bare "$nj"); [ -z "$v" ] || printf '%s: %.0f; ' "$nj" "$v"; done | sed 's/; $//')."
    echo
    echo "## All measurements"
    echo
    echo "| workload | system | jobs | IOPS | mean lat (µs) | p99 lat (µs) | IOPS vs bare |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    for workload in $WORKLOADS; do
        for nj in $ALLJOBS; do
            any=0
            for system in $run_systems; do
                [ "$system" = bare ] || [ -z "$(get "$workload" "$system" "$nj")" ] || any=1
            done
            [ "$workload" != origin-randwrite ] || any=1
            [ "$any" = 1 ] || continue
            b=$(bare_of "$workload")
            base=$(get "$b" bare "$nj")
            if [ -n "$base" ]; then
                printf '| %s | %s | %s | %.0f | %.1f | %.1f | 1.00 |\n' "$workload" "$(bare_label "$workload")" "$nj" \
                    "$base" "$(get "$b" bare "$nj" 5)" "$(get "$b" bare "$nj" 6)"
            fi
            for system in $run_systems; do
                [ "$system" != bare ] || continue
                iops=$(get "$workload" "$system" "$nj")
                [ -n "$iops" ] || continue
                printf '| %s | %s | %s | %.0f | %.1f | %.1f | %s |\n' "$workload" "$system" "$nj" \
                    "$iops" "$(get "$workload" "$system" "$nj" 5)" "$(get "$workload" "$system" "$nj" 6)" \
                    "$(pratio "$workload" "$system" "$b" bare "$nj")"
            done
        done
    done
    echo
    echo "IOPS vs bare: this row's IOPS divided by the bare nbdkit file plugin's"
    echo "IOPS for the same kind of I/O with the same number of jobs, measured in"
    echo "this run: 4 KiB random writes for origin-randwrite, origin-overwrite and"
    echo "snapshot-randwrite; 512-byte random writes for origin-overwrite-512; the"
    echo "one-pass random writes for origin-firstwrite; random reads for the"
    echo "snapshot reads."
} >"$md"

# --- targets ---------------------------------------------------------------
# ratio_list NUMER_W NUMER_S DENOM_W DENOM_S [JOBS]: sets rl_text to
# "1: 0.97 · 2: 0.95 ..." and rl_vals to "NJ:RATIO ..." (for verdict).
ratio_list() {
    local nj r
    rl_text='' rl_vals=''
    for nj in ${5:-$NUMJOBS}; do
        r=$(pratio "$1" "$2" "$3" "$4" "$nj")
        [ "$r" != n/a ] || continue
        rl_text="$rl_text${rl_text:+ · }$nj: $r"
        rl_vals="$rl_vals $nj:$r"
    done
    rl_text=${rl_text:-not measured}
}
# verdict MIN [STRICT_FROM]: every ratio in $rl_vals >= MIN, and > MIN from
# STRICT_FROM jobs/threads up.
verdict() {
    [ -n "$rl_vals" ] || { echo "not measured"; return; }
    awk -v min="$1" -v from="${2:-0}" -v vals="$rl_vals" 'BEGIN {
        n = split(vals, v, " "); bad = "";
        for (i = 1; i <= n; i++) {
            split(v[i], p, ":");
            if (p[2] + 0 < min || (from > 0 && p[1] + 0 >= from && p[2] + 0 <= min))
                bad = bad (bad == "" ? "" : ", ") p[1];
        }
        if (bad == "") print "**met**"; else print "**missed** (at " bad ")" }'
}
fmt_vals() {   # "1:0.9 2:2.1" -> "1: 0.9 · 2: 2.1"
    awk -v v="$1" 'BEGIN { n = split(v, a, " "); for (i = 1; i <= n; i++) { split(a[i], p, ":"); printf "%s%s: %s", (i > 1 ? " · " : ""), p[1], p[2] } }'
}
target_row() {   # target_row TARGET SYSTEM WHAT THRESHOLD NW NS DW DS MIN [STRICT_FROM] [JOBS]
    ratio_list "$5" "$6" "$7" "$8" "${11:-}"
    printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" "$rl_text" "$(verdict "$9" "${10:-}")"
}
context_row() {  # context_row LABEL NW NS DW DS [JOBS]
    ratio_list "$2" "$3" "$4" "$5" "${6:-}"
    echo "| $1 | $rl_text |"
}
{
    echo
    echo "## Targets (issue 5)"
    echo
    echo "Ratios at each number of jobs (connections), \`jobs: ratio\`; a target is"
    echo "met when it holds at every job count measured in this run."
    echo
    echo "| target | system | measured as | threshold | ratios | verdict |"
    echo "|---|---|---|---|---|---|"
    if has_system snapfg-nosnap; then
        target_row "origin write, no snapshot" snapfg-nosnap "origin-randwrite / bare randwrite" "≥ 0.95" \
            origin-randwrite snapfg-nosnap origin-randwrite bare 0.95
    fi
    if has_system snapfg-checkpoint; then
        target_row "origin write, checkpoint only (issue 12)" snapfg-checkpoint \
            "origin-randwrite / bare randwrite" "≥ 0.95" \
            origin-randwrite snapfg-checkpoint origin-randwrite bare 0.95
    fi
    for system in snapfg-transient snapfg-persistent; do
        has_system "$system" || continue
        target_row "origin overwrite, snapshot active" "$system" "origin-overwrite / bare randwrite" "≥ 0.90" \
            origin-overwrite "$system" origin-randwrite bare 0.90
    done
    for system in snapfg-transient snapfg-persistent; do
        has_system "$system" || continue
        target_row "snapshot random read (not copied)" "$system" "snapshot-randread / bare randread" "≥ 0.90" \
            snapshot-randread "$system" snapshot-randread bare 0.90
        target_row "snapshot random read (copied)" "$system" "snapshot-randread-cow / bare randread" "≥ 0.90" \
            snapshot-randread-cow "$system" snapshot-randread bare 0.90
    done
    if has_system snapfg-transient; then
        target_row "origin first write, transient, $CHUNK_SIZE chunks" snapfg-transient \
            "origin-firstwrite / bare one-pass randwrite" "≥ 0.50" \
            origin-firstwrite snapfg-transient origin-firstwrite bare 0.50
    fi
    for system in snapfg-transient snapfg-persistent; do
        has_system "$system" || continue
        target_row "512-byte writes to remapped chunks" "$system" \
            "origin-overwrite-512 / its origin-overwrite (IOPS)" "≥ 0.80" \
            origin-overwrite-512 "$system" origin-overwrite "$system" 0.80
    done
    if has_system snapfg-transient && has_system snapfg-global; then
        for w in snapshot-randread origin-firstwrite origin-overwrite origin-overwrite-512 snapshot-randread-cow snapshot-randwrite; do
            target_row "striped vs locking=global" snapfg-transient "$w: striped / global" \
                "≥ 1.00, > 1.00 from 4 jobs" "$w" snapfg-transient "$w" snapfg-global 1.00 4
        done
    fi
    # The lock microbenchmark's table: | threads | percpu | rwlock | mutex | rwlock/percpu | mutex/percpu |
    if [ -s "$lockmd" ]; then
        lk=$(awk -F'|' '$2 ~ /^ *[0-9]+ *$/ && NF >= 7 { gsub(/ /, "", $2); gsub(/ /, "", $6); print $2 ":" $6 }' "$lockmd")
        one=$(tr ' ' '\n' <<<"$lk" | awk -F: '$1 == 1 { print $1 ":" $2 }')
        more=$(tr ' ' '\n' <<<"$lk" | awk -F: '$1 > 1 { print $1 ":" $2 }' | tr '\n' ' ')
        rl_vals=$one
        printf '| per-CPU read lock vs pthread_rwlock, 1 thread | lock-bench | rwlock ns/op ÷ per-CPU ns/op | ≥ 1.00 | %s | %s |\n' \
            "$(fmt_vals "$one")" "$(verdict 1.00)"
        rl_vals=$more
        printf '| per-CPU read lock vs pthread_rwlock, 2+ threads (threads: ratio) | lock-bench | rwlock ns/op ÷ per-CPU ns/op | ≥ 2.00 | %s | %s |\n' \
            "$(fmt_vals "$more")" "$(verdict 2.00)"
    fi
    echo
    echo "Context (no target):"
    echo
    echo "| comparison | ratios |"
    echo "|---|---|"
    context_row "bare: 512-byte / 4 KiB random writes" origin-randwrite-512 bare origin-randwrite bare
    for system in snapfg-persistent snapfg-global; do
        has_system "$system" || continue
        context_row "$system: origin-firstwrite / bare one-pass randwrite" origin-firstwrite "$system" origin-firstwrite bare
    done
    if has_system qemu-fleecing; then
        for w in origin-firstwrite origin-overwrite snapshot-randread snapshot-randread-cow; do
            context_row "qemu-fleecing: $w / $(bare_label "$w")" "$w" qemu-fleecing "$(bare_of "$w")" bare "$NUMJOBS_PEERS"
            if has_system snapfg-transient; then
                context_row "snapfg-transient / qemu-fleecing: $w" "$w" snapfg-transient "$w" qemu-fleecing "$NUMJOBS_PEERS"
            fi
        done
    fi
    for c in cow-4K cow-64K; do
        has_system "$c" || continue
        context_row "$c: snapshot-randwrite / bare 4K randwrite" snapshot-randwrite "$c" origin-randwrite bare "$NUMJOBS_PEERS"
        if has_system snapfg-transient; then
            context_row "snapfg-transient / $c: snapshot-randwrite" snapshot-randwrite snapfg-transient snapshot-randwrite "$c" "$NUMJOBS_PEERS"
        fi
    done
} >>"$md"

# --- issue 10: first writes -------------------------------------------------
# The job counts the issue names (1 and 4 connections), those measured.
T10_JOBS=$(for nj in ${T10_JOBS:-1 4}; do [[ " $NUMJOBS " != *" $nj "* ]] || printf '%s ' "$nj"; done)
T10_JOBS=${T10_JOBS% }
{
    echo
    echo "## Targets (issue 10: first writes with a snapshot)"
    echo
    echo "Ratios to bare at ${T10_JOBS:-no measured} connection(s), medians of the per-round ratios;"
    echo "snapfg-persistent is the default mode (store=persistent, crash-safe),"
    echo "snapfg-transient is store=transient; chunk-size=$CHUNK_SIZE."
    echo
    echo "| target | system | measured as | threshold | ratios | verdict |"
    echo "|---|---|---|---|---|---|"
    for system in snapfg-persistent snapfg-persistent-flush snapfg-transient; do
        has_system "$system" || continue
        min=0.30; [ "$system" = snapfg-transient ] && min=0.60
        target_row "sequential 1 MiB first writes, QD$SEQ_IODEPTH" "$system" "origin-seqfirstwrite / bare" "≥ $min" \
            origin-seqfirstwrite "$system" origin-seqfirstwrite bare "$min" "" "$T10_JOBS"
    done
    for system in snapfg-persistent snapfg-persistent-flush snapfg-transient; do
        has_system "$system" || continue
        min=0.50; [ "$system" = snapfg-transient ] && min=0.70
        target_row "random 4K first writes, QD$IODEPTH per job" "$system" "origin-firstwrite / bare one-pass" "≥ $min" \
            origin-firstwrite "$system" origin-firstwrite bare "$min" "" "$T10_JOBS"
    done
    for system in snapfg-persistent snapfg-transient; do
        has_system "$system" || continue
        target_row "origin overwrite" "$system" "origin-overwrite / bare randwrite" "≥ 0.90" \
            origin-overwrite "$system" origin-randwrite bare 0.90 "" "$T10_JOBS"
        target_row "snapshot read (not copied)" "$system" "snapshot-randread / bare randread" "≥ 0.90" \
            snapshot-randread "$system" snapshot-randread bare 0.90 "" "$T10_JOBS"
        target_row "snapshot read (copied)" "$system" "snapshot-randread-cow / bare randread" "≥ 0.90" \
            snapshot-randread-cow "$system" snapshot-randread bare 0.90 "" "$T10_JOBS"
    done
    if has_system snapfg-nosnap; then
        target_row "no snapshot" snapfg-nosnap "origin-randwrite / bare randwrite" "≥ 0.95" \
            origin-randwrite snapfg-nosnap origin-randwrite bare 0.95 "" "$T10_JOBS"
    fi
    echo
    echo "At every job count measured (no target):"
    echo
    echo "| comparison | ratios |"
    echo "|---|---|"
    for system in snapfg-persistent snapfg-persistent-flush snapfg-transient; do
        has_system "$system" || continue
        context_row "$system: origin-seqfirstwrite / bare" origin-seqfirstwrite "$system" origin-seqfirstwrite bare
        context_row "$system: origin-firstwrite / bare one-pass" origin-firstwrite "$system" origin-firstwrite bare
    done
} >>"$md"

# --- the persistent store ----------------------------------------------------
if has_system snapfg-persistent || has_system snapfg-persistent-flush; then
    {
        echo
        echo "## Persistent store (default mode): first writes and group commit"
        echo
        echo "From the store's closing debug line (nbdkit -v): \"N exceptions committed"
        echo "in G groups with S syncs (C commit calls)\", summed over the rounds, for the"
        echo "servers that ran only the first writes: random 4 KiB (with the snapshot"
        echo "reads before them, which commit nothing) and sequential 1 MiB.  A commit"
        echo "call is one batch of copy-outs (one request's fresh chunks); a group is"
        echo "the exceptions made durable by the same syncs."
        echo
        echo "| system | workload | jobs | bare IOPS | transient IOPS | its IOPS | / transient | / bare | exceptions | commit calls | groups | syncs | exceptions / commit call | exceptions / group | syncs / exception |"
        echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        for psys in snapfg-persistent snapfg-persistent-flush; do
          has_system "$psys" || continue
          for phase in firstwrite seqfirstwrite; do
            w=origin-$phase
            for nj in $NUMJOBS; do
                b=$(get "$w" bare "$nj")
                t=$(get "$w" snapfg-transient "$nj")
                p=$(get "$w" "$psys" "$nj")
                [ -n "$p" ] || continue
                read -r e g sy c < <(awk -v n="$nj" -v ph="$phase" -v sys="$psys" '$1 == n && $2 == ph && ($7 == "" ? "snapfg-persistent" : $7) == sys { e += $3; g += $4; s += $5; c += $6 }
                                      END { if (e) print e, g, s, c }' "$pstats"; echo)
                printf '| %s | %s | %s | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$psys" "$w" "$nj" "${b:-0}" "${t:-0}" "${p:-0}" \
                    "$(pratio "$w" "$psys" "$w" snapfg-transient "$nj")" \
                    "$(pratio "$w" "$psys" "$w" bare "$nj")" "${e:-?}" "${c:-?}" "${g:-?}" "${sy:-?}" \
                    "$(ratio "${e:-0}" "${c:-0}")" "$(ratio "${e:-0}" "${g:-0}")" \
                    "$(awk -v s="${sy:-0}" -v e="${e:-0}" 'BEGIN { if (e > 0) printf "%.3f", s / e; else printf "n/a" }')"
            done
          done
        done
        others=$(awk '$2 != "firstwrite" && $2 != "seqfirstwrite" { printf "%s%s %s jobs %s: %s exceptions, %s groups, %s syncs", sep, ($7 == "" ? "snapfg-persistent" : $7), $2, $1, $3, $4, $5; sep = "; " }' "$pstats")
        [ -z "$others" ] || { echo; echo "Other persistent servers (same line): $others."; }
    } >>"$md"
fi

if [ -s "$lockmd" ]; then
    { echo; echo "## Lock microbenchmark (contrib/bench/lock-bench)"; echo; cat "$lockmd"; } >>"$md"
fi
if [ -s "$startmd" ]; then
    { echo; echo "## Reopening a persistent store (contrib/bench/startup.sh $STARTUP_EXCEPTIONS)"; echo
      echo '```'; grep -v '^|' "$startmd" || true; echo '```'; echo; grep '^|' "$startmd" || true; } >>"$md"
fi

backupmd=$OUTDIR/backup.md
if [ -s "$backupmd" ]; then
    { echo; echo "## snapfg-backup: incremental against full (contrib/bench/backup-bench.sh)"; echo
      grep '^|' "$backupmd" || true; echo; grep -v '^|' "$backupmd" || true; } >>"$md"
fi

# --- the plot: IOPS against connections, one panel per workload -------------
if command -v gnuplot >/dev/null 2>&1; then
    pdir=$OUTDIR/plot
    mkdir -p "$pdir"
    plots=()
    for w in $WORKLOADS; do
        b=$(bare_of "$w")
        cols=("bare:$b")
        for system in $run_systems; do
            [ "$system" != bare ] || continue
            for nj in $ALLJOBS; do
                if [ -n "$(get "$w" "$system" "$nj")" ]; then cols+=("$system:$w"); break; fi
            done
        done
        [ "${#cols[@]}" -gt 1 ] || [ "$w" = origin-randwrite ] || continue
        {
            printf 'jobs'
            for c in "${cols[@]}"; do
                if [ "${c%%:*}" = bare ]; then printf ' "%s"' "$(bare_label "$w")"; else printf ' "%s"' "${c%%:*}"; fi
            done
            echo
            for nj in $ALLJOBS; do
                printf '%s' "$nj"
                for c in "${cols[@]}"; do
                    v=$(get "${c#*:}" "${c%%:*}" "$nj")
                    printf ' %s' "${v:-?}"
                done
                echo
            done
        } >"$pdir/$w.dat"
        plots+=("$w:$(( ${#cols[@]} + 1 ))")
    done
    color_of() {
        case $1 in
            bare*) echo '#000000' ;;
            snapfg-nosnap) echo '#7f7f7f' ;;
            snapfg-checkpoint) echo '#f0e442' ;;
            snapfg-transient) echo '#009e73' ;;
            snapfg-persistent) echo '#0072b2' ;;
            snapfg-persistent-flush) echo '#56b4e9' ;;
            snapfg-global) echo '#e69f00' ;;
            cow-4K) echo '#cc79a7' ;;
            cow-64K) echo '#8c564b' ;;
            qemu-fleecing) echo '#d62728' ;;
            *) echo '#56b4e9' ;;
        esac
    }
    n=${#plots[@]}
    rows=$(( (n + 3) / 4 ))
    {
        echo "set terminal pngcairo size 1800,$(( rows * 560 )) font ',10'"
        echo "set output '$OUTDIR/results-iops.png'"
        echo "set datafile missing '?'"
        echo "set key autotitle columnhead noenhanced below font ',8' maxrows 3"
        echo "set logscale x 2"
        echo "set xtics ($(sed 's/ *$//; s/ /, /g' <<<"$ALLJOBS"))"
        echo "set xrange [0.8:$(awk -v j="$ALLJOBS" 'BEGIN { n = split(j, a, " "); print a[n] * 1.25 }')]"
        echo "set yrange [0:*]"
        echo "set grid"
        echo "set ylabel 'IOPS'"
        echo "set multiplot layout $rows,4 title 'snapfg vs bare nbdkit file and peers: IOPS (y) vs connections = fio numjobs (x) (iodepth $IODEPTH, ${RUNTIME}s, $(nproc) CPUs)'"
        for p in "${plots[@]}"; do
            echo "set title '${p%%:*}' noenhanced"
            f=$pdir/${p%%:*}.dat
            read -r -a heads < <(head -n 1 "$f" | sed 's/"bare ([^"]*)"/bare/; s/"//g')
            cmd=
            for ((i = 2; i <= ${p#*:}; i++)); do
                dt=1
                [ "${heads[i-1]}" != bare ] || dt=2
                cmd="$cmd${cmd:+, }'$f' using 1:$i with linespoints lw 2 pt 7 dt $dt lc rgb '$(color_of "${heads[i-1]}")'"
            done
            echo "plot $cmd"
        done
        echo "unset multiplot"
    } >"$pdir/plot.gp"
    if gnuplot "$pdir/plot.gp" 2>"$OUTDIR/logs/gnuplot.log"; then
        log "chart: $OUTDIR/results-iops.png"
        { echo; echo "![IOPS vs connections](results-iops.png)"; } >>"$md"
    else
        log "gnuplot failed (see $OUTDIR/logs/gnuplot.log); no chart"
    fi
fi

cat "$md"
log "results: $md, $csv"
