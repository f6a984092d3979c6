#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A flush during a merge makes the COW store durable too: origin writes
# to chunks not merged yet go into the COW file, so a flush that synced
# only the origin file acknowledged writes a power cut could lose.
#
# nbdkit merges a persistent snapshot of 64 exceptions; the merge thread
# claims its first batch (chunks 48-63) and then sleeps in the test hook
# SNAPFG_TEST_MERGE_DELAY_US, so it syncs nothing meanwhile.  strace
# (attached to nbdkit, tracing fdatasync and fsync) then shows:
#   - an origin write to chunk 2 (unmerged: it goes to the COW file)
#     syncs nothing by itself;
#   - a flush on the origin export syncs the COW file, before the
#     origin file, before the flush returns;
#   - a FUA write to chunk 3 syncs the COW file.
# The origin view reads back the snapshot's data plus those writes;
# nbdkit is then killed and restarted, the merge resumes and finishes,
# and the origin file equals that model byte for byte.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
requires strace

chunk=4096
size=$((4 * 1024 * 1024))
trace="$tmpdir/strace.log"
test_files "$size"
cow="$tmpdir/m.cow"
cp "$origin" "$tmpdir/model.img"     # the snapshot's view: the origin now

SNAPFG_TEST_MERGE_DELAY_US=600000000 \
    start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock"
ctl_ok "create m" "$ctlsock" create m --cow "$cow" --chunk-size $chunk
# One request: the 64 copy-outs commit in chunk order, so the merge's
# first batch (the last 16 pairs of the table) is chunks 48-63.
failures_io write "$(uri "$sock" origin)" 0 $((64 * chunk)) --seed 7 >/dev/null ||
    fail "origin write of 64 chunks failed"
ctl_ok "merge m" "$ctlsock" merge m

npid=$(nbdkit_pid "$pid")
strace -f -qq -e trace=fdatasync,fsync -p "$npid" -o "$trace" 2>"$tmpdir/strace.err" &
strace_pid=$!
on_exit "kill $strace_pid 2>/dev/null"
# strace has attached once nbdkit's status says it is traced.
wait_until 30 bash -c "awk '/^TracerPid:/ { exit \$2 == 0 }' /proc/$npid/status" ||
    skip "strace cannot attach to nbdkit: $(cat "$tmpdir/strace.err")"
sleep 1     # every thread, not only the first

fd_of() {
    local f
    for f in /proc/"$npid"/fd/*; do
        [ "$(readlink "$f")" = "$1" ] && { basename "$f"; return 0; }
    done
    return 1
}
cow_fd=$(fd_of "$cow") || fail "nbdkit has no descriptor open on $cow"
origin_fd=$(fd_of "$origin") || fail "nbdkit has no descriptor open on $origin"
info "nbdkit $npid: COW file on fd $cow_fd, origin file on fd $origin_fd"
syncs_of() { grep -cE "(fdatasync|fsync)\\($1\\)" "$trace" || true; }

ctl "$ctlsock" --json status m || true
[ "$(jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["state"]')" = merging ] ||
    fail "m is not merging: $(cat "$tmpdir/ctl.out")"

failures_io write "$(uri "$sock" origin)" $((2 * chunk)) $chunk --seed 8 --model "$tmpdir/model.img" >/dev/null ||
    fail "origin write to chunk 2 during the merge failed"
n=$(syncs_of "$cow_fd")
[ "$n" = 0 ] && info "ok: a plain write during the merge syncs nothing" ||
    check_fail "a plain origin write during the merge synced the COW file $n times (expected 0)"

failures_io flush "$(uri "$sock" origin)" >/dev/null || fail "flush during the merge failed"
n=$(syncs_of "$cow_fd")
if [ "$n" -ge 1 ]; then
    info "ok: the flush synced the COW file ($n times) before it returned"
else
    cat "$trace" >&2
    check_fail "the flush during the merge did not sync the COW file (fd $cow_fd), where the write to chunk 2 went"
fi
last_cow=$(grep -nE "(fdatasync|fsync)\\($cow_fd\\)" "$trace" | tail -n1 | cut -d: -f1 || true)
last_origin=$(grep -nE "(fdatasync|fsync)\\($origin_fd\\)" "$trace" | tail -n1 | cut -d: -f1 || true)
if [ -z "$last_origin" ]; then
    check_fail "the flush did not sync the origin file (fd $origin_fd)"
elif [ -n "$last_cow" ] && [ "$last_cow" -lt "$last_origin" ]; then
    info "ok: the COW file is synced before the origin file"
else
    check_fail "the flush did not sync the COW file before the origin file (trace lines: COW ${last_cow:-none}, origin $last_origin)"
fi

before=$(syncs_of "$cow_fd")
failures_io write "$(uri "$sock" origin)" $((3 * chunk)) $chunk --seed 9 --fua --model "$tmpdir/model.img" >/dev/null ||
    fail "FUA origin write to chunk 3 during the merge failed"
n=$(syncs_of "$cow_fd")
[ "$n" -gt "$before" ] && info "ok: a FUA write during the merge syncs the COW file" ||
    check_fail "a FUA origin write to an unmerged chunk did not sync the COW file"
kill "$strace_pid" 2>/dev/null || true
wait "$strace_pid" 2>/dev/null || true

# Chunks 48-63 are claimed by the sleeping merge batch: reads wait there.
failures_io read "$(uri "$sock" origin)" 0 $((48 * chunk)) --model "$tmpdir/model.img" >/dev/null ||
    check_fail "origin view during the merge (chunks 0-47) differs from the snapshot's data plus the writes"
failures_io read "$(uri "$sock" origin)" $((64 * chunk)) $((size - 64 * chunk)) --model "$tmpdir/model.img" >/dev/null ||
    check_fail "origin view during the merge (past chunk 63) differs from the model"

# The merge thread sleeps for 600 s: kill nbdkit, let a restart finish it.
kill -KILL "$npid"
wait_nbdkit_death "$pid" 30 2>/dev/null
[ "$nbdkit_status" = 137 ] || fail "nbdkit did not die of SIGKILL (status $nbdkit_status)"
rm -f "$ctlsock"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" control="$ctlsock"
wait_until 120 bash -c "! '$SNAPFGCTL' -S '$ctlsock' status snapshot >/dev/null 2>&1" ||
    fail "the resumed merge did not finish within 120 s"
info "ok: the merge resumed after the restart and finished"
stop_nbdkit "$pid"
files_equal "$origin" "$tmpdir/model.img" "after the merge the origin file is the snapshot's data plus the writes made during it"

finish
