#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The backup repository on S3 beside the same repository on a directory.
#
#   contrib/bench/repo-s3-bench.sh [SIZE]      (default 512M)
#
# Starts a local Ceph RADOS Gateway (tests/s3-functions.sh: one monitor,
# one OSD on a sparse file, radosgw on 127.0.0.1) and serves a random
# origin of SIZE (DATA_PERCENT [62] of it data, the rest a hole) with
# state= and control=.  In ROUNDS [3] paired rounds, the order
# alternating, a full backup of the same disk into a new repository on a
# directory and into a new one in a bucket; then 5 % of the 64 KiB
# granules change and an incremental goes into each; then each restores
# the last run to a file (the two must be equal).  Prints a table, the
# medians and the S3 / directory ratios.  The gateway shares the 2 CPUs
# with the backup, so the S3 column measures the whole local setup, not
# a remote store.  Environment: SNAPFG_PLUGIN, SNAPFG_BACKUP, SNAPFGCTL
# (default: this tree's builds), ROUNDS, DATA_PERCENT, CHANGED_PERCENT.
set -euo pipefail
size=${1:-512M}
top=$(cd "$(dirname "$0")/../.." && pwd)
export top_srcdir=$top
# The test helpers give the gateway, a temporary directory and cleanup.
set +u
source "$top/tests/functions.sh"
source "$top/tests/s3-functions.sh"
set -u
plugin=${SNAPFG_PLUGIN:-$top/plugins/snapfg/.libs/nbdkit-snapfg-plugin.so}
tool=${SNAPFG_BACKUP:-$top/tools/snapfg-backup/snapfg-backup}
[ -x "$PWD/tools/snapfg-backup/snapfg-backup" ] && [ -z "${SNAPFG_BACKUP:-}" ] &&
    tool=$PWD/tools/snapfg-backup/snapfg-backup
rounds=${ROUNDS:-3}
data_pct=${DATA_PERCENT:-62}
pct=${CHANGED_PERCENT:-5}
tmp=$tmpdir

s3_gateway_start
bucket=snapfg-bench
s3_make_bucket "$bucket"

bytes=$(numfmt --from=iec "$size")
data_bytes=$((bytes / 100 * data_pct / 2097152 * 2097152))
head -c $((data_bytes / 2)) /dev/urandom >"$tmp/origin.img"
head -c $((data_bytes / 8 * 3)) /dev/urandom | base64 -w 0 | head -c $((data_bytes / 2)) >>"$tmp/origin.img"
truncate -s "$bytes" "$tmp/origin.img"
nbdkit -f -U "$tmp/sock" -P "$tmp/pid" "$plugin" origin="$tmp/origin.img" \
    state="$tmp/origin.state" control="$tmp/ctl" 2>"$tmp/nbdkit.log" &
nbdkit_pid=$!
on_exit "kill $nbdkit_pid 2>/dev/null; wait $nbdkit_pid 2>/dev/null"
for _ in $(seq 300); do [ -S "$tmp/ctl" ] && [ -s "$tmp/pid" ] && break; sleep 0.1; done
uri="nbd+unix:///?socket=$tmp/sock"

now() { date +%s.%N; }
# timed ARGS...: snapfg-backup ARGS, its wall time in seconds on stdout.
timed() {
    local t0 t1
    sync
    t0=$(now)
    "$tool" "$@" >>"$tmp/bench.log" 2>&1 ||
        { tail -n 20 "$tmp/bench.log" >&2; fail "snapfg-backup $* failed"; }
    t1=$(now)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}
backup() { timed -S "$tmp/ctl" -u "$uri" backup "$@"; }
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

echo "| round | full, directory (s) | full, S3 (s) | S3 / directory |"
echo "|---|---|---|---|"
dfull=() sfull=()
for r in $(seq "$rounds"); do
    d=$tmp/repo-$r s=s3://$bucket/repo-$r
    "$tool" init "$d" >>"$tmp/bench.log" 2>&1 || fail "init $d"
    "$tool" init "$s" >>"$tmp/bench.log" 2>&1 || fail "init $s"
    if [ $((r % 2)) -eq 1 ]; then
        td=$(backup "$d" --disk bench); ts=$(backup "$s" --disk bench)
    else
        ts=$(backup "$s" --disk bench); td=$(backup "$d" --disk bench)
    fi
    dfull+=("$td") sfull+=("$ts")
    echo "| $r | $td | $ts | $(ratio "$ts" "$td") |"
    # Keep only the last round's repositories.
    [ "$r" -eq "$rounds" ] || rm -rf "$d"
done

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
d=$tmp/repo-$rounds s=s3://$bucket/repo-$rounds
# One incremental each, from the same change: the second one's snapshot
# sees the same data, as the first one's run adds no write.
ti_d=$(backup "$d" --disk bench)
ti_s=$(backup "$s" --disk bench)
tr_d=$(timed restore "$d" "$tmp/restore-dir.img" --disk bench)
tr_s=$(timed restore "$s" "$tmp/restore-s3.img" --disk bench)
cmp "$tmp/restore-dir.img" "$tmp/restore-s3.img" ||
    fail "the restores from the directory and from S3 differ"

md=$(median "${dfull[@]}") ms=$(median "${sfull[@]}")
echo
echo "| repository, $size disk ($data_pct % data) | directory (s) | S3 on local Ceph (s) | S3 / directory |"
echo "|---|---|---|---|"
echo "| full backup (median of $rounds) | $md | $ms | $(ratio "$ms" "$md") |"
echo "| incremental, $pct % of granules changed ($changed bytes) | $ti_d | $ti_s | $(ratio "$ti_s" "$ti_d") |"
echo "| restore of the last run | $tr_d | $tr_s | $(ratio "$tr_s" "$tr_d") |"
echo "S3 gateway start-up: ${S3_GATEWAY_STARTUP} s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
