#!/bin/bash
# Compare snapfg with a bare nbdkit file plugin, using fio's nbd engine.
#
#   contrib/bench/fio-compare.sh          ("make bench" runs it)
#
# Builds nothing: it uses the plugin built in the tree.  For each system
#
#   bare              nbdkit file plugin serving the origin file
#   snapfg-nosnap     snapfg, no snapshot (no cow=)
#   snapfg-transient  snapfg with a store=transient snapshot, locking=striped
#   snapfg-global     the same with locking=global (one mutex)
#
# it starts nbdkit on a Unix socket and runs fio (--ioengine=nbd) with
# 4 KiB requests, iodepth 16, for each number of jobs, on these workloads:
#
#   origin-randwrite      origin random writes, no snapshot
#                         (bare, snapfg-nosnap)
#   snapshot-randread     random reads of a fresh snapshot: every read is
#                         routed to the origin and tracked (bare: reads of
#                         the file)
#   origin-firstwrite     origin random writes with a fresh snapshot: each
#                         4 KiB block is written once, so every write of a
#                         4 KiB chunk copies it out first (one pass over the
#                         disk, split between the jobs, stopped after
#                         RUNTIME seconds; bare: the same pass)
#   origin-overwrite      origin random writes after a full sequential pass
#                         has copied every chunk out (state D everywhere)
#   snapshot-randread-cow random reads of the snapshot once every chunk is
#                         in the COW store
#
# Each snapfg system gets a fresh server and COW file per job count, and
# runs the snapshot workloads in the order above.  IOPS, mean latency and
# p99 latency (completion + submission, fio's lat) come from fio's JSON
# output; every row is compared with the bare system's IOPS for the same
# kind of I/O measured in the same run.
#
# Environment (defaults in brackets):
#   SNAPFG_PLUGIN  the plugin [plugins/snapfg/.libs/nbdkit-snapfg-plugin.so
#                  under the current directory, else under this tree]
#   RUNTIME        seconds per measurement [10]
#   NUMJOBS        job counts to run [1 4]
#   IODEPTH        fio iodepth per job [16]
#   BS             request size [4k]
#   SIZE           origin size [1G]
#   CHUNK_SIZE     snapfg chunk-size= [4K]
#   SYSTEMS        systems to run [bare snapfg-nosnap snapfg-transient
#                  snapfg-global]; snapfg-persistent (store=persistent,
#                  striped) may be added
#   BENCH_DIR      where the origin and COW files go [new dir in /var/tmp]
#   OUTDIR         where results go [bench-results/DATE under the current
#                  directory]: results.md, results.csv, json/, and
#                  results-iops.png when gnuplot is installed
#   NBDKIT_THREADS nbdkit --threads [nbdkit's default]

set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

RUNTIME=${RUNTIME:-10}
NUMJOBS=${NUMJOBS:-"1 4"}
IODEPTH=${IODEPTH:-16}
BS=${BS:-4k}
SIZE=${SIZE:-1G}
CHUNK_SIZE=${CHUNK_SIZE:-4K}
SYSTEMS=${SYSTEMS:-"bare snapfg-nosnap snapfg-transient snapfg-global"}

die() { echo "fio-compare: error: $*" >&2; exit 1; }
log() { echo "fio-compare: $*" >&2; }

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

if [ -z "${SNAPFG_PLUGIN:-}" ]; then
    for p in "$PWD/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so" \
             "$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so"; do
        if [ -f "$p" ]; then SNAPFG_PLUGIN=$p; break; fi
    done
fi
[ -n "${SNAPFG_PLUGIN:-}" ] && [ -f "$SNAPFG_PLUGIN" ] ||
    die "plugin not found (build it with make, or set SNAPFG_PLUGIN)"

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
mkdir -p "$OUTDIR/json"
OUTDIR=$(cd "$OUTDIR" && pwd)

origin=$work/origin.img
cow=$work/snapshot.cow
sock=$work/nbd.sock
pidfile=$work/nbdkit.pid
nbdkit_pid=

stop_server() {
    # Every fio run has finished by now: nbdkit 1.32 does not exit on
    # SIGTERM while clients are connected.
    local pid=$nbdkit_pid
    [ -n "$pid" ] || return 0
    nbdkit_pid=
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 300); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "nbdkit $pid did not exit within 30 s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$?
    set +e
    stop_server
    if [ "$made_work" = 1 ]; then rm -rf "$work"; else rm -f "$origin" "$cow" "$sock"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start_server SYSTEM: nbdkit for SYSTEM on $sock, fresh COW file.
start_server() {
    local system=$1 args=()
    rm -f "$sock" "$pidfile" "$cow"
    case $system in
        bare)             args=(file file="$origin") ;;
        snapfg-nosnap)    args=("$SNAPFG_PLUGIN" origin="$origin") ;;
        snapfg-transient) args=("$SNAPFG_PLUGIN" origin="$origin" cow="$cow"
                                store=transient locking=striped chunk-size="$CHUNK_SIZE") ;;
        snapfg-global)    args=("$SNAPFG_PLUGIN" origin="$origin" cow="$cow"
                                store=transient locking=global chunk-size="$CHUNK_SIZE") ;;
        snapfg-persistent) args=("$SNAPFG_PLUGIN" origin="$origin" cow="$cow"
                                store=persistent locking=striped chunk-size="$CHUNK_SIZE") ;;
        *) die "unknown system $system" ;;
    esac
    local threads=()
    [ -z "${NBDKIT_THREADS:-}" ] || threads=(--threads "$NBDKIT_THREADS")
    nbdkit -f --exit-with-parent "${threads[@]}" -U "$sock" -P "$pidfile" \
        "${args[@]}" 2>"$OUTDIR/nbdkit-$system.log" &
    nbdkit_pid=$!
    for _ in $(seq 300); do
        [ -S "$sock" ] && [ -s "$pidfile" ] && return 0
        if ! kill -0 "$nbdkit_pid" 2>/dev/null; then
            nbdkit_pid=
            cat "$OUTDIR/nbdkit-$system.log" >&2
            die "nbdkit ($system) did not start: nbdkit ${args[*]}"
        fi
        sleep 0.1
    done
    die "nbdkit ($system) did not create $sock within 30 s"
}

# export_of SYSTEM WORKLOAD: the export name fio uses.
export_of() {
    case $1:$2 in
        bare:*) echo "" ;;
        *:snapshot-*) echo snapshot ;;
        *) echo origin ;;
    esac
}

# run_fio SYSTEM WORKLOAD NUMJOBS: one measurement; appends a result line
# "WORKLOAD SYSTEM NUMJOBS IOPS MEAN_US P99_US" to $results.
results=$OUTDIR/raw.txt
: >"$results"
run_fio() {
    local system=$1 workload=$2 nj=$3 rw mode=timed json exp
    case $workload in
        origin-randwrite|origin-overwrite) rw=randwrite ;;
        origin-firstwrite) rw=randwrite; mode=onepass ;;
        snapshot-randread|snapshot-randread-cow) rw=randread ;;
        *) die "unknown workload $workload" ;;
    esac
    exp=$(export_of "$system" "$workload")
    json=$OUTDIR/json/$workload-$system-j$nj.json
    local opts=(--name="$workload" --ioengine=nbd
                --uri="nbd+unix:///$exp?socket=$sock"
                --rw="$rw" --bs="$BS" --iodepth="$IODEPTH" --numjobs="$nj"
                --group_reporting --lat_percentiles=1
                --output-format=json --output="$json")
    if [ "$mode" = onepass ]; then
        # Each job writes its own 1/nj of the disk, each block once (fio's
        # random map), stopping early after RUNTIME seconds.
        local part=$(( size_bytes / nj ))
        part=$(( part / 65536 * 65536 ))
        opts+=(--size="$part" --offset_increment="$part" --runtime="$RUNTIME")
    else
        opts+=(--time_based --runtime="$RUNTIME" --norandommap --randrepeat=0)
    fi
    log "$workload on $system, $nj job(s)"
    fio "${opts[@]}" >"$OUTDIR/json/$workload-$system-j$nj.out" 2>&1 ||
        { cat "$OUTDIR/json/$workload-$system-j$nj.out" >&2
          die "fio failed: $workload on $system with $nj job(s)"; }
    local line
    line=$(parse_json "$json") || die "cannot read $json"
    echo "$workload $system $nj $line" >>"$results"
}

# parse_json FILE: "IOPS MEAN_US P99_US" of the job group's reads or writes.
parse_json() {
    if [ "$json_tool" = jq ]; then
        jq -r '.jobs[0] as $j
               | (if $j.write.total_ios > 0 then $j.write else $j.read end) as $d
               | [ $d.iops,
                   $d.lat_ns.mean / 1000,
                   (($d.lat_ns.percentile // $d.clat_ns.percentile)["99.000000"] // 0) / 1000 ]
               | map(. * 100 | round / 100) | map(tostring) | join(" ")' "$1"
    else
        /usr/bin/python3 - "$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
d = j["write"] if j["write"]["total_ios"] > 0 else j["read"]
pct = d["lat_ns"].get("percentile") or d["clat_ns"].get("percentile") or {}
print("%.2f %.2f %.2f" % (d["iops"], d["lat_ns"]["mean"] / 1000,
                          pct.get("99.000000", 0) / 1000))
PY
    fi
}

# fill_pass SYSTEM: write the whole origin once, sequentially (1 MiB), so
# that every chunk is copied out.
fill_pass() {
    log "full sequential pass over the origin ($1)"
    fio --name=fill --ioengine=nbd --uri="nbd+unix:///origin?socket=$sock" \
        --rw=write --bs=1M --iodepth=8 --numjobs=1 \
        --output="$OUTDIR/json/fill-$1.out" >/dev/null 2>&1 ||
        { cat "$OUTDIR/json/fill-$1.out" >&2; die "the full pass failed on $1"; }
}

# --- run ----------------------------------------------------------------
log "plugin $SNAPFG_PLUGIN"
log "work dir $work, results in $OUTDIR"
log "creating a $SIZE origin"
head -c "$size_bytes" /dev/urandom >"$origin"

for nj in $NUMJOBS; do
    for system in $SYSTEMS; do
        start_server "$system"
        case $system in
            bare)
                run_fio bare snapshot-randread "$nj"
                run_fio bare origin-firstwrite "$nj"
                run_fio bare origin-randwrite "$nj"
                ;;
            snapfg-nosnap)
                run_fio "$system" origin-randwrite "$nj"
                ;;
            *)
                run_fio "$system" snapshot-randread "$nj"
                run_fio "$system" origin-firstwrite "$nj"
                fill_pass "$system"
                run_fio "$system" origin-overwrite "$nj"
                run_fio "$system" snapshot-randread-cow "$nj"
                ;;
        esac
        stop_server
    done
done

# --- report ---------------------------------------------------------------
# The bare measurement each workload is compared with.
bare_of() {
    case $1 in
        origin-randwrite|origin-overwrite) echo origin-randwrite ;;
        origin-firstwrite) echo origin-firstwrite ;;
        snapshot-randread|snapshot-randread-cow) echo snapshot-randread ;;
    esac
}

WORKLOADS="origin-randwrite snapshot-randread origin-firstwrite origin-overwrite snapshot-randread-cow"
csv=$OUTDIR/results.csv
md=$OUTDIR/results.md
echo "workload,system,numjobs,iodepth,bs,runtime_s,iops,lat_mean_us,lat_p99_us,iops_vs_bare" >"$csv"
{
    echo "# snapfg fio comparison"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- host: $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)), $(free -g | awk '/^Mem:/ {print $2}') GiB RAM, kernel $(uname -r)"
    echo "- $(nbdkit --version | head -n 1), $(fio --version)"
    echo "- plugin: $SNAPFG_PLUGIN"
    echo "- origin: $SIZE file in $work (page cache), chunk-size=$CHUNK_SIZE"
    echo "- fio: --ioengine=nbd, bs=$BS, iodepth=$IODEPTH, runtime ${RUNTIME}s per row"
    echo
    echo "| workload | system | jobs | IOPS | mean lat (µs) | p99 lat (µs) | IOPS vs bare |"
    echo "|---|---|---:|---:|---:|---:|---:|"
} >"$md"
# bare_line WORKLOAD NUMJOBS: "IOPS MEAN P99" of the bare baseline.
bare_line() {
    awk -v w="$(bare_of "$1")" -v n="$2" \
        '$1 == w && $2 == "bare" && $3 == n { print $4, $5, $6 }' "$results"
}
ratio() {
    awk -v a="$1" -v b="${2:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }'
}
# The CSV: every measurement once.
while read -r w s n iops mean p99; do
    read -r base _ < <(bare_line "$w" "$n"; echo)
    echo "$w,$s,$n,$IODEPTH,$BS,$RUNTIME,$iops,$mean,$p99,$(ratio "$iops" "$base")" >>"$csv"
done <"$results"
# The table: each workload and job count with its bare baseline first.
for workload in $WORKLOADS; do
    for nj in $NUMJOBS; do
        base=
        if read -r base bmean bp99 < <(bare_line "$workload" "$nj"); then
            printf '| %s | bare | %s | %.0f | %.1f | %.1f | 1.00 |\n' \
                "$workload" "$nj" "$base" "$bmean" "$bp99" >>"$md"
        fi
        while read -r w s n iops mean p99; do
            [ "$w" = "$workload" ] && [ "$n" = "$nj" ] && [ "$s" != bare ] || continue
            printf '| %s | %s | %s | %.0f | %.1f | %.1f | %s |\n' \
                "$w" "$s" "$n" "$iops" "$mean" "$p99" "$(ratio "$iops" "$base")" >>"$md"
        done <"$results"
    done
done
{
    echo
    echo "IOPS vs bare: this row's IOPS divided by the bare nbdkit file plugin's"
    echo "IOPS for the same kind of I/O with the same number of jobs, measured in"
    echo "this run (random writes for origin-randwrite and origin-overwrite, the"
    echo "one-pass random writes for origin-firstwrite, random reads for the"
    echo "snapshot reads)."
} >>"$md"

# --- an optional chart ------------------------------------------------------
if command -v gnuplot >/dev/null 2>&1; then
    dat=$OUTDIR/iops.dat
    {
        printf 'row'
        for nj in $NUMJOBS; do printf ' jobs=%s' "$nj"; done
        echo
        for w in $WORKLOADS; do
            for sys in $SYSTEMS; do
                row=
                any=0
                for nj in $NUMJOBS; do
                    v=$(awk -v w="$w" -v s="$sys" -v n="$nj" '$1 == w && $2 == s && $3 == n { print $4 }' "$results")
                    [ -z "$v" ] || any=1
                    row="$row ${v:-0}"
                done
                [ "$any" = 0 ] || echo "$w/$sys$row"
            done
        done
    } >"$dat"
    ncols=$(( $(echo "$NUMJOBS" | wc -w) + 1 ))
    if gnuplot <<EOF 2>"$OUTDIR/gnuplot.log"
set terminal pngcairo size 1400,700
set output '$OUTDIR/results-iops.png'
set title 'snapfg fio comparison: IOPS (bs=$BS, iodepth=$IODEPTH)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key top right autotitle columnhead
set xtics rotate by -40 noenhanced font ',9'
set ylabel 'IOPS'
set yrange [0:*]
set rmargin 10
set grid ytics
set bmargin 12
plot for [i=2:$ncols] '$dat' using i:xtic(1)
EOF
    then
        log "chart: $OUTDIR/results-iops.png"
    else
        log "gnuplot failed (see $OUTDIR/gnuplot.log); no chart"
    fi
fi

cat "$md"
log "results: $md, $csv"
