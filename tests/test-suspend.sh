#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# suspend and resume on the control socket (origin writes held, in the
# manner of dm's suspend/resume), against a real nbdkit:
#
#  1. suspend: an origin write waits (it does not fail) and stats count
#     it; a read of the origin is served meanwhile; a snapshot create
#     works while suspended and its instant is the suspend's; a write
#     to a snapshot view is not held; resume releases the write, which
#     then lands on the origin and not in the snapshot;
#  2. the timeout: with no resume, the server resumes by itself, logs
#     it, and the held write goes on; resume then says it was not
#     suspended (timed out);
#  3. refusals: a second suspend, timeouts out of bounds or not a
#     number; the server still serves afterwards.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

size=$((4 * 1024 * 1024))
test_files "$size"
writer="$(dirname "$0")/suspend-writer.py"
start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock"
log="$pid.log"

# stat_field EXPR: EXPR of the origin's stats (d is its JSON object).
stat_field() {
    "$SNAPFGCTL" -S "$ctlsock" --json stats >"$tmpdir/stats.json"
    "$PY" -c '
import json, sys
d = [x for x in json.load(open(sys.argv[1]))["exports"]
     if x["export"] == "origin"][0]
print(eval(sys.argv[2]))' "$tmpdir/stats.json" "$1"
}

# expect_stat EXPR WANT WHAT
expect_stat() {
    local got
    got=$(stat_field "$1")
    [ "$got" = "$2" ] && info "ok: $3: $1 = $2" ||
        check_fail "$3: $1 is '$got', expected '$2'"
}

# start_writer NAME BYTE: one origin write of 64K of BYTE at 1M in the
# background; returns once it is connected.
start_writer() {
    rm -f "$tmpdir/$1.ready" "$tmpdir/$1.done"
    "$PY" "$writer" "$(uri "$sock")" 1048576 65536 "$2" \
        "$tmpdir/$1.ready" "$tmpdir/$1.done" &
    writer_pid=$!
    wait_until 20 test -e "$tmpdir/$1.ready" || fail "$1: writer did not connect"
}

# =====================================================================
info "=== 1. suspend holds origin writes; create and reads still work"
expect_stat 'd["suspended"]' False "before suspend"
ctl_ok "suspend 60" "$ctlsock" suspend 60
grep -q "new origin writes wait until resume" "$tmpdir/ctl.out" ||
    check_fail "suspend printed '$(cat "$tmpdir/ctl.out")'"
expect_stat 'd["suspended"]' True "suspended"
ctl_ok "status while suspended" "$ctlsock" status
grep -q "origin writes are held" "$tmpdir/ctl.out" ||
    check_fail "status does not say writes are held"

start_writer w1 0xaa
# The write must still be waiting a while later (a write that is not
# held completes in milliseconds).
sleep 2
[ ! -e "$tmpdir/w1.done" ] && info "ok: the origin write waits while suspended" ||
    check_fail "the origin write completed while suspended"
kill -0 "$writer_pid" 2>/dev/null || check_fail "the writer exited while suspended"
wait_until 10 test "$(stat_field 'd["suspend_waiting"]')" = 1 ||
    check_fail "stats do not show the waiting write"
expect_stat 'd["suspend_waiting"]' 1 "stats while a write waits"

# A reader is served: the origin still has its old data at 1M.
origin_serves "a read while suspended" "$sock"
nbdcopy "$(uri "$sock")" "$tmpdir/during.img" ||
    check_fail "nbdcopy of the origin failed while suspended"
files_equal "$tmpdir/during.img" "$orig" "the origin read while suspended"

# The point of a suspend: a snapshot can be created meanwhile.
ctl_ok "create while suspended" "$ctlsock" create snap1 --cow "$tmpdir/snap1.cow"
# A write to the snapshot view is not held.
timeout 20 "$PY" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\x55" * 4096, 2 * 1048576); h.flush(); h.shutdown()' \
    "$(uri "$sock" snap1)" && info "ok: a snapshot write is not held" ||
    check_fail "a write to the snapshot view failed or was held"
[ ! -e "$tmpdir/w1.done" ] || check_fail "the origin write completed before resume"

ctl_ok "resume" "$ctlsock" --json resume
"$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["resumed"] is True and d["waiting"] == 1 and d["held_ms"] >= 2000, d' \
    "$tmpdir/ctl.out" && info "ok: resume says it resumed, one write waiting" ||
    check_fail "resume reply: $(cat "$tmpdir/ctl.out")"
wait "$writer_pid" || check_fail "the held writer failed after resume"
[ -e "$tmpdir/w1.done" ] && info "ok: resume released the write" ||
    check_fail "the write did not complete after resume"
expect_stat 'd["suspended"]' False "after resume"
expect_stat 'd["suspend_held_writes"]' 1 "after resume"
expect_stat 'd["suspends"]' 1 "after resume"

# The origin has the write; the snapshot (taken while suspended) has
# the origin as it was, plus its own write.
cp "$orig" "$tmpdir/expect-origin.img"
"$PY" -c '
import sys
f = open(sys.argv[1], "r+b"); f.seek(1048576); f.write(b"\xaa" * 65536)' \
    "$tmpdir/expect-origin.img"
export_equals "$(uri "$sock")" "$tmpdir/expect-origin.img" "origin after resume"
cp "$orig" "$tmpdir/expect-snap.img"
"$PY" -c '
import sys
f = open(sys.argv[1], "r+b"); f.seek(2 * 1048576); f.write(b"\x55" * 4096)' \
    "$tmpdir/expect-snap.img"
export_equals "$(uri "$sock" snap1)" "$tmpdir/expect-snap.img" \
    "the snapshot created while suspended"

# =====================================================================
info "=== 2. the timeout: the server resumes by itself"
ctl_ok "suspend 1.5" "$ctlsock" suspend 1.5
start_writer w2 0xbb
wait_until 30 test -e "$tmpdir/w2.done" ||
    check_fail "the write stayed held after the suspend's timeout"
wait "$writer_pid" || check_fail "the writer failed after the timeout"
# The write was held (counted as such) and went on at the timeout.
expect_stat 'd["suspend_held_writes"]' 2 "after the timeout"
expect_stat 'd["suspended"]' False "after the timeout"
expect_stat 'd["suspend_timeouts"]' 1 "after the timeout"
grep -q "suspend 2 ended by its timeout of 1500 ms.*1 were waiting" "$log" &&
    info "ok: the timeout is logged" || check_fail "the timeout is not logged"
ctl_ok "resume after the timeout" "$ctlsock" resume
grep -q "not suspended: suspend 2 had ended by its timeout" "$tmpdir/ctl.out" ||
    check_fail "resume after the timeout printed '$(cat "$tmpdir/ctl.out")'"

# =====================================================================
info "=== 3. refusals"
ctl_ok "suspend (default timeout)" "$ctlsock" --json suspend
grep -q '"timeout_ms": *10000' "$tmpdir/ctl.out" ||
    check_fail "default timeout: $(cat "$tmpdir/ctl.out")"
ctl_refused "a second suspend" "already held" "$ctlsock" suspend 5
ctl_ok "resume" "$ctlsock" resume
for bad in abc 0 0.05 301 1x; do
    ctl_refused "suspend $bad" "timeout" "$ctlsock" suspend "$bad"
done
expect_stat 'd["suspended"]' False "after the refusals"
still_serving() {
    origin_serves "$1" "$sock" || true
    ctl "$ctlsock" status >/dev/null || check_fail "$1: status fails afterwards"
}
still_serving "after the refusals"
fill_export "$(uri "$sock")" 0 4096 0x11 || check_fail "a write after the refusals"

stop_nbdkit "$pid"
finish
