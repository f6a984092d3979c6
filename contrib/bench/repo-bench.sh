#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup into a repository (issue 30's targets), paired rounds
# against nbdcopy of the same snapshot export:
#
#   contrib/bench/repo-bench.sh [SIZE]      (default 1G)
#
# Each round (the order of the copies alternating between rounds):
#   - nbdcopy of a snapshot export into a new raw file;
#   - a full backup into a new directory repository, plain;
#   - a full backup into a new encrypted repository with --compress;
#   - restore of the plain repository's point into a new raw file;
#   - 5 % of the disk rewritten as whole 4 MiB chunks (changes with some
#     locality, as a guest's files have), then an incremental backup
#     into the plain repository.
# Once more after the rounds, the worst case for 4 MiB chunks: 5 % of
# the 64 KiB granules rewritten, scattered uniformly (nearly every chunk
# then holds a change, and the incremental reads nearly everything).
# nbdcopy is timed twice, plain and with --flush (its file durable, as
# every chunk and restored file of snapfg-backup is).
# The medians of the per-round ratios are the figures: full / nbdcopy
# (goal <= 1.1), zstd+encrypted / nbdcopy (<= 1.5), incremental / full
# (<= 0.15), restore / nbdcopy (<= 1.2).  Once: a second disk made from
# the same image backed up into the first repository, its stored bytes
# against the first disk's (<= 10 %).
# Environment: SNAPFG_PLUGIN, SNAPFG_BACKUP, SNAPFGCTL (default: this
# tree's builds), ROUNDS [5], CHANGED_PERCENT [5], DATA_PERCENT [62],
# REPO_THREADS (snapfg-backup --threads), TMPDIR (where the
# repositories go: the disk they are on is part of what is measured),
# WARM_MIB [2048; 0: off]: memory touched and freed before each timed
# copy, as in backup-bench.sh (this VM hands free pages back to its
# host, and a copy after a pause would fault its page cache back in).
# COLD_ROUNDS [3; 0: off; needs root]: after the rounds, restore against
# nbdcopy with the page cache dropped before each: the chunks a backup
# writes bypass the page cache (O_DIRECT), so the rounds' restore reads
# them from the disk while nbdcopy reads an origin the page cache holds;
# a restore days after its backup reads from the disk, and so, here,
# does nbdcopy.
set -euo pipefail
size=${1:-1G}
pct=${CHANGED_PERCENT:-5}
top=$(cd "$(dirname "$0")/../.." && pwd)
plugin=${SNAPFG_PLUGIN:-$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so}
tool=${SNAPFG_BACKUP:-$top/tools/snapfg-backup/snapfg-backup}
ctl=${SNAPFGCTL:-$top/tools/snapfgctl/snapfgctl}
rounds=${ROUNDS:-5}
data_pct=${DATA_PERCENT:-62}
threads=()
[ -z "${REPO_THREADS:-}" ] || threads=(--threads "$REPO_THREADS")
tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/repo-bench.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

bytes=$(numfmt --from=iec "$size")
# Data in the first DATA_PERCENT, a hole after it: half random, half
# base64 text (6 bits of entropy a byte), so that zstd has work to do.
data_bytes=$((bytes / 100 * data_pct / 2097152 * 2097152))
head -c $((data_bytes / 2)) /dev/urandom >"$tmp/a.img"
head -c $((data_bytes / 8 * 3)) /dev/urandom | base64 -w 0 | head -c $((data_bytes / 2)) >>"$tmp/a.img"
truncate -s "$bytes" "$tmp/a.img"
cp --sparse=always "$tmp/a.img" "$tmp/b.img"
serve() {   # TAG
    nbdkit -f -U "$tmp/$1.sock" -P "$tmp/$1.pid" "$plugin" origin="$tmp/$1.img" \
        state="$tmp/$1.state" control="$tmp/$1.ctl" 2>"$tmp/$1.log" &
    pids+=($!)
    for _ in $(seq 300); do [ -S "$tmp/$1.ctl" ] && [ -s "$tmp/$1.pid" ] && break; sleep 0.1; done
}
serve a
serve b
uri() { echo "nbd+unix:///${2:-}?socket=$tmp/$1.sock"; }
printf '%s' "bench-key-$$" >"$tmp/key"
chmod 600 "$tmp/key"

warm_mib=${WARM_MIB:-2048}
warm() {
    [ "$warm_mib" -gt 0 ] || return 0
    dd if=/dev/zero of=/dev/shm/repo-bench-warm.$$ bs=1M count="$warm_mib" status=none
    rm -f /dev/shm/repo-bench-warm.$$
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
run() {     # ARGS... -> seconds; the JSON result in $tmp/last.json
    local t0 t1
    sync
    warm
    drop_caches
    t0=$(now)
    "$tool" --json "$@" >"$tmp/last.json" 2>"$tmp/last.err" ||
        { cat "$tmp/last.err" "$tmp/last.json" >&2; echo "repo-bench: snapfg-backup $* failed" >&2; exit 1; }
    t1=$(now)
    elapsed "$t0" "$t1"
}
jfield() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$tmp/last.json" "$1"; }
cold=0
drop_caches() { [ "$cold" -eq 0 ] || { sync; echo 1 >/proc/sys/vm/drop_caches; }; }
nbdcopy_round() {   # [--flush]
    local t0 t1
    "$ctl" -S "$tmp/a.ctl" create bench-snap >/dev/null
    rm -f "$tmp/copy.raw"
    sync
    warm
    drop_caches
    t0=$(now)
    nbdcopy "$@" "$(uri a bench-snap)" "$tmp/copy.raw"
    t1=$(now)
    "$ctl" -S "$tmp/a.ctl" drop bench-snap >/dev/null
    rm -f "$tmp/copy.raw"
    elapsed "$t0" "$t1"
}
full_round() {    # NAME [init args] -- [backup args]
    local name=$1
    shift
    rm -rf "${tmp:?}/$name"
    local init=() bk=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do init+=("$1"); shift; done
    [ $# -eq 0 ] || shift
    bk=("$@")
    "$tool" init "$tmp/$name" "${init[@]}" >/dev/null
    run -S "$tmp/a.ctl" -u "$(uri a)" backup "$tmp/$name" --disk a "${threads[@]}" "${bk[@]}"
}
restore_round() {
    rm -f "$tmp/restored.raw"
    run restore "$tmp/plain" "$tmp/restored.raw" --disk a "${threads[@]}"
    rm -f "$tmp/restored.raw"
}
change() {   # SEED [GRANULE]
    /usr/bin/python3 - "$(uri a)" "$bytes" "$pct" "$1" "${2:-4194304}" <<'PY'
import nbd, os, random, sys
uri, size, pct, seed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
g = int(sys.argv[5])
granules = size // g
h = nbd.NBD()
h.connect_uri(uri)
for i in random.Random(seed).sample(range(granules), int(granules * pct / 100)):
    h.pwrite(os.urandom(g), i * g)
h.flush()
h.shutdown()
PY
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# A second disk made from the same image, into the first repository.
"$tool" init "$tmp/dedup" >/dev/null
run -S "$tmp/a.ctl" -u "$(uri a)" backup "$tmp/dedup" --disk a "${threads[@]}" >/dev/null
first=$(jfield bytes_added)
run -S "$tmp/b.ctl" -u "$(uri b)" backup "$tmp/dedup" --disk b "${threads[@]}" >/dev/null
second=$(jfield bytes_added)
dedup_line="- second disk from the same image: stored $second bytes against $first for the first: $(ratio "$second" "$first") (goal <= 0.10)"
echo "| round | nbdcopy (s) | nbdcopy --flush (s) | full plain (s) | full zstd+enc (s) | restore (s) | incr $pct % (s) | full / nbdcopy | full / --flush | zstd+enc / nbdcopy | zstd+enc / --flush | restore / nbdcopy | restore / --flush | incr / full |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
r_full=(); r_enc=(); r_rest=(); r_incr=(); t_fulls=(); f_full=(); f_enc=(); f_rest=()
for r in $(seq "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then
        tc=$(nbdcopy_round)
        tf=$(nbdcopy_round --flush)
        tp=$(full_round plain)
        te=$(full_round enc --encrypt --key-file "$tmp/key" -- --compress --key-file "$tmp/key")
        tr=$(restore_round)
    else
        tr=""
        te=$(full_round enc --encrypt --key-file "$tmp/key" -- --compress --key-file "$tmp/key")
        tp=$(full_round plain)
        tr=$(restore_round)
        tf=$(nbdcopy_round --flush)
        tc=$(nbdcopy_round)
    fi
    change "$r" >/dev/null
    ti=$(run -S "$tmp/a.ctl" -u "$(uri a)" backup "$tmp/plain" --disk a "${threads[@]}")
    [ "$(jfield type)" = incremental ] || { echo "repo-bench: the incremental was not one" >&2; exit 1; }
    t_fulls+=("$tp")
    r_full+=("$(ratio "$tp" "$tc")"); r_enc+=("$(ratio "$te" "$tc")")
    r_rest+=("$(ratio "$tr" "$tc")"); r_incr+=("$(ratio "$ti" "$tp")")
    f_full+=("$(ratio "$tp" "$tf")"); f_enc+=("$(ratio "$te" "$tf")"); f_rest+=("$(ratio "$tr" "$tf")")
    echo "| $r | $tc | $tf | $tp | $te | $tr | $ti | ${r_full[-1]} | ${f_full[-1]} | ${r_enc[-1]} | ${f_enc[-1]} | ${r_rest[-1]} | ${f_rest[-1]} | ${r_incr[-1]} |"
done
echo
echo "medians of $rounds paired rounds ($size disk, $data_pct % data):"
echo "- full plain / nbdcopy: $(median "${r_full[@]}") (goal <= 1.1); / nbdcopy --flush (durable, as a backup is): $(median "${f_full[@]}")"
echo "- full zstd+encrypted / nbdcopy: $(median "${r_enc[@]}") (goal <= 1.5); / nbdcopy --flush: $(median "${f_enc[@]}")"
echo "- incremental ($pct % changed) / full plain: $(median "${r_incr[@]}") (goal <= 0.15)"
echo "- restore / nbdcopy: $(median "${r_rest[@]}") (goal <= 1.2); / nbdcopy --flush: $(median "${f_rest[@]}")"

cold_rounds=${COLD_ROUNDS:-3}
if [ "$cold_rounds" -gt 0 ] && [ -w /proc/sys/vm/drop_caches ]; then
    cold=1
    c_rest=()
    for r in $(seq "$cold_rounds"); do
        tc=$(nbdcopy_round)
        tr=$(restore_round)
        c_rest+=("$(ratio "$tr" "$tc")")
        echo "  cold round $r: nbdcopy $tc s, restore $tr s"
    done
    cold=0
    echo "- restore / nbdcopy, the page cache dropped before each (a restore days after its backup): $(median "${c_rest[@]}") (median of $cold_rounds)"
fi
echo "$dedup_line"
change 99 65536 >/dev/null
ts=$(run -S "$tmp/a.ctl" -u "$(uri a)" backup "$tmp/plain" --disk a "${threads[@]}")
echo "- incremental with $pct % of the 64 KiB granules changed, scattered: $ts s, read $(jfield bytes_read) bytes; / median full plain: $(ratio "$ts" "$(median "${t_fulls[@]}")")"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
