#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Write-back in a real memory cgroup (issue 29): held data lives in a
# memory file charged to the cgroup that cannot be reclaimed, so a
# writeback-max larger than the cgroup allows must be lowered (logged,
# naming both values), and a burst of first writes must end in
# backpressure, never in an OOM kill.
#
# A v1 memory cgroup of 96M (skipped where one cannot be made: not root,
# no v1 memory controller); nbdkit started in it with writeback-max=512M,
# a persistent snapshot and durability=sync; 3,000 first writes of
# 64 KiB (187 MiB, twice the cgroup), 16 in flight, the committer
# paused (SNAPFG_TEST_WRITEBACK_PAUSE) until writers wait for room, then
# let go.  Expected: held data full and nbdkit alive, then every write
# acknowledged, no OOM kill in the cgroup, and after a flush the origin
# file equals the model byte for byte.  Then the
# default writeback-max in the same cgroup: no more than it allows.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
requires nbdkit truncate

[ "$(id -u)" = 0 ] || skip "creating a memory cgroup needs root"
cgroot=/sys/fs/cgroup/memory
[ -f "$cgroot/memory.limit_in_bytes" ] ||
    skip "no cgroup v1 memory controller at $cgroot"
cg="$cgroot/snapfg-test-$$"
mkdir "$cg" 2>"$tmpdir/mkdir.err" ||
    skip "cannot create a memory cgroup: $(cat "$tmpdir/mkdir.err")"
# nbdkit is the only process in it: stopped before the cgroup goes.
on_exit 'for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -KILL $p; done; for _ in $(seq 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done'
# (SNAPFG_TEST_CGROUP_MIB: another size, to measure.)
limit=$((${SNAPFG_TEST_CGROUP_MIB:-96} * 1024 * 1024))
echo "$limit" >"$cg/memory.limit_in_bytes"

# nbdkit, started in the cgroup: a wrapper first in PATH.
mkdir "$tmpdir/bin"
cat >"$tmpdir/bin/nbdkit" <<WRAP
#!/bin/sh
echo \$\$ >"$cg/cgroup.procs" || exit 1
exec $(command -v nbdkit) "\$@"
WRAP
chmod +x "$tmpdir/bin/nbdkit"
PATH="$tmpdir/bin:$PATH"

test_files
size=$((256 * 1024 * 1024))
model="$tmpdir/model.img"
rm -f "$origin" "$model"
truncate -s "$size" "$origin"
truncate -s "$size" "$model"

stat_field() {
    "$SNAPFGCTL" --socket "$ctlsock" stats --json >"$tmpdir/stats.json" ||
        return 1
    jq_py "$tmpdir/stats.json" \
        "[x for x in d['exports'] if x['export'] == 'origin'][0]['$1']"
}
oom_kills() { awk '$1 == "oom_kill" { print $2 }' "$cg/memory.oom_control"; }

pause="$tmpdir/pause"
touch "$pause"
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" \
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" cow-size=512M \
    control="$ctlsock" writeback=on writeback-max=512M durability=sync
nbdkit_pid=$(cat "$pid")
grep -qx "$nbdkit_pid" "$cg/cgroup.procs" ||
    fail "nbdkit ($nbdkit_pid) is not in $cg"
max=$(stat_field writeback_max_bytes)
[ "$max" -lt "$limit" ] &&
    info "ok: writeback-max=512M lowered to $max in a cgroup of $limit" ||
    check_fail "writeback-max is $max in a memory cgroup of $limit bytes"
grep -q "writeback-max=536870912 is more than the memory cgroup allows: its limit is $limit" "$pid.log" &&
    info "ok: the lowering is logged with both values" ||
    check_fail "no log line names writeback-max=536870912 and the limit $limit"
[ "$(grep -c 'is more than the memory cgroup allows' "$pid.log")" = 1 ] ||
    check_fail "the lowering is not logged exactly once"

# The burst: 3,000 first writes of 64 KiB, 16 in flight, then a flush.
# The committer is paused at first, so that what is held certainly
# grows to writeback-max and writers wait for room: the cgroup must
# not run out meanwhile.  Then it goes on.
"$PY" - "$(uri "$sock" origin)" "$model" >"$tmpdir/burst.out" 2>&1 <<'PYEOF' &
import nbd, os, random, sys
uri, model = sys.argv[1], sys.argv[2]
h = nbd.NBD()
h.connect_uri(uri)
n, size, inflight = 3000, 65536, 16
slots = random.sample(range(h.get_size() // size), n)
acked = failed = 0
pending = {}
def done(err):
    global acked, failed
    if err.value:
        failed += 1
    else:
        acked += 1
    return 1
with open(model, "r+b") as m:
    for i, slot in enumerate(slots):
        while h.aio_in_flight() >= inflight:
            h.poll(-1)
        data = os.urandom(size)
        m.seek(slot * size)
        m.write(data)
        h.aio_pwrite(data, slot * size, completion=done)
while h.aio_in_flight() > 0:
    h.poll(-1)
print("acked %d failed %d" % (acked, failed))
try:
    h.flush()
    print("flush ok")
except nbd.Error as e:
    print("flush failed: %s" % e)
h.shutdown()
PYEOF
burst_pid=$!
# (Done too if nbdkit has died: the checks below say so.)
waiting() {
    ! _proc_alive "$nbdkit_pid" || [ "$(stat_field writeback_waiting)" -gt 0 ]
}
if wait_until 300 waiting && _proc_alive "$nbdkit_pid"; then
    sleep 2
    held=$(stat_field writeback_held_bytes)
    info "ok: writers wait for room with $held bytes held (writeback-max $max), cgroup usage $(cat "$cg/memory.usage_in_bytes")"
    _proc_alive "$nbdkit_pid" || check_fail "nbdkit died when write-back was full"
    [ "$(oom_kills)" = 0 ] || check_fail "OOM kill when write-back was full"
elif _proc_alive "$nbdkit_pid"; then
    check_fail "writers never waited for room with the committer paused"
else
    check_fail "nbdkit died before write-back was full (OOM kills in the cgroup: $(oom_kills))"
fi
rm -f "$pause"
wait "$burst_pid" || true
cat "$tmpdir/burst.out"
grep -qx 'acked 3000 failed 0' "$tmpdir/burst.out" &&
    info "ok: all 3000 writes acknowledged" ||
    check_fail "not every write was acknowledged: $(head -3 "$tmpdir/burst.out")"
grep -qx 'flush ok' "$tmpdir/burst.out" || check_fail "the flush failed"
_proc_alive "$nbdkit_pid" && info "ok: nbdkit is alive" ||
    check_fail "nbdkit died in the cgroup (OOM kill?)"
kills=$(oom_kills)
[ "${kills:-0}" = 0 ] && info "ok: no OOM kill in the cgroup" ||
    check_fail "the cgroup counts $kills OOM kill(s)"
grep -q '^under_oom 0' "$cg/memory.oom_control" || check_fail "the cgroup is under OOM"
info "cgroup: max usage $(cat "$cg/memory.max_usage_in_bytes") of $limit, failcnt $(cat "$cg/memory.failcnt"), writeback-max $max, room waits $(stat_field writeback_room_waits || echo '?')"
if _proc_alive "$nbdkit_pid"; then
    stop_nbdkit "$pid"
    files_equal "$origin" "$model" "the origin file after the burst and a flush"
fi

# The default writeback-max in the same cgroup.
start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock" writeback=on
max=$(stat_field writeback_max_bytes)
[ "$max" -lt "$limit" ] && info "ok: the default writeback-max is $max in the cgroup" ||
    check_fail "the default writeback-max is $max in a memory cgroup of $limit bytes"
stop_nbdkit "$pid"
finish
