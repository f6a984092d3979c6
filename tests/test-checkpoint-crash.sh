#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Checkpoints across crashes: never a silently incomplete delta.
#
# 1. kill -9 of the server while a writer runs (three times: twice a
#    plain SIGKILL, once SNAPFG_TEST_CRASH_AT=origin-write, which dies
#    just before an origin write), between the checkpoint's creation and
#    the next query.  After each restart (same boot id), changed --since
#    holds every granule of every acknowledged request and only granules
#    of requests that were sent, and every byte that differs from the
#    origin at the checkpoint's instant lies in it.
# 2. A simulated unclean system stop: kill -9, then a restart with
#    another SNAPFG_TEST_BOOT_ID.  The checkpoint that was tracking is
#    inconsistent (listed so, recorded in the catalogue, still after
#    another restart); changed --since it (or from an older checkpoint
#    up to now) is refused with a message saying a full backup is
#    needed.  The older checkpoint, frozen and clean, still answers up to
#    the snapshot taken with the inconsistent one.  A new checkpoint
#    works, also after a clean stop and another boot id.  Dropping the
#    inconsistent checkpoint makes its predecessor inconsistent too.
# 3. A bitmap write error (SNAPFG_TEST_CBT_WRITE_ERROR=N fails the Nth
#    write of bits with EIO): the origin writes still succeed and read
#    back, the checkpoint is inconsistent (logged, listed, recorded in the
#    catalogue, still after a kill -9 and a restart) and changed --since
#    it is refused.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

MiB=$((1024 * 1024))
G=65536
size=$((32 * MiB))
state="$tmpdir/state.json"
test_files "$size"

acked_at_least() {
    local n
    n=$(grep -c '^A' "$1" 2>/dev/null) || n=0
    [ "$n" -ge "$2" ]
}
# writeback=off: every acknowledged write must be in the checkpoint and
# on the origin after a kill -9.
start() {
    start_snapfg "$sock" "$pid" origin="$origin" state="$state" control="$ctlsock" writeback=off
}
kill9() {
    kill -KILL "$(nbdkit_pid "$pid")"
    wait_nbdkit_death "$pid" 30
    [ "$nbdkit_status" = 137 ] || fail "nbdkit did not die of SIGKILL ($nbdkit_status)"
}

# =====================================================================
info "=== 1. kill -9 while a writer runs"
export SNAPFG_TEST_BOOT_ID=boot-A
start
cp "$origin" "$tmpdir/model-0.img"
ctl_ok "checkpoint create c0" "$ctlsock" checkpoint create c0
: >"$tmpdir/all.log"
model="$tmpdir/model-0.img"
for round in 1 2 3; do
    wd="$tmpdir/w$round"
    mkdir -p "$wd"
    if [ "$round" = 2 ]; then
        # Dies just before the 80th origin write from now, bitmap set.
        stop_nbdkit "$pid"
        SNAPFG_TEST_CRASH_AT=origin-write:80 start
    fi
    ckio writer "$(uri "$sock" origin)" --size "$size" --dir "$wd" \
        --model "$model" --seed "$round" --threads 4 --sleep 0.005 \
        >"$wd/out" 2>&1 &
    w=$!
    if [ "$round" = 2 ]; then
        wait_nbdkit_death "$pid" 120
        [ "$nbdkit_status" = 137 ] ||
            fail "SNAPFG_TEST_CRASH_AT=origin-write:80 did not kill nbdkit ($nbdkit_status)"
    else
        wait_until 120 acked_at_least "$wd/ops.log" 100 ||
            fail "round $round: the writer does not write: $(cat "$wd/out")"
        kill9
    fi
    wait "$w" || fail "round $round: the writer failed: $(cat "$wd/out")"
    info "round $round: $(grep -c '^A' "$wd/ops.log") requests acknowledged, $(grep -c '^S' "$wd/ops.log") sent before the kill"
    grep -v '^P' "$wd/ops.log" >>"$tmpdir/all.log"
    model="$wd/model-end.img"

    start
    ckio expect-ranges "$tmpdir/all.log" --granularity "$G" --size "$size" >"$tmpdir/acked.json"
    ckio expect-ranges "$tmpdir/all.log" --granularity "$G" --size "$size" --sent >"$tmpdir/sent.json"
    nbdcopy -- "$(uri "$sock" origin)" "$tmpdir/origin-now.img"
    if ctl "$ctlsock" --json changed --since c0 &&
       ckio check-changed "$tmpdir/ctl.out" --superset-of "$tmpdir/acked.json" \
           --subset-of "$tmpdir/sent.json" --old "$tmpdir/model-0.img" \
           --new "$tmpdir/origin-now.img" >"$tmpdir/check.out" 2>&1; then
        info "ok: round $round: c0 after the crash: $(tr '\n' ';' <"$tmpdir/check.out")"
    else
        check_fail "round $round: c0 after the crash: $(cat "$tmpdir/ctl.err" "$tmpdir/check.out" 2>/dev/null)"
    fi
    ctl "$ctlsock" --json checkpoint list
    [ "$(jq_py "$tmpdir/ctl.out" 'd["checkpoints"][0]["state"]')" = active ] ||
        check_fail "round $round: c0 is not active after a process crash: $(cat "$tmpdir/ctl.out")"
done

# =====================================================================
info "=== 2. a simulated unclean system stop"
# c0 is frozen (and clean) at s1's instant; c1 tracks from there.
ctl_ok "create s1 --checkpoint c1" "$ctlsock" create s1 --cow "$tmpdir/s1.cow" --checkpoint c1
ctl "$ctlsock" --json changed --since c0 s1 && cp "$tmpdir/ctl.out" "$tmpdir/c0-s1.json" ||
    check_fail "changed --since c0 s1: $(cat "$tmpdir/ctl.err")"
"$PY" - "$(uri "$sock" origin)" <<'EOF'
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for i in range(20):
    h.pwrite(b"\x5a" * 4096, i * 3 * 65536)
h.shutdown()
EOF
kill9
lose_tmpfs                      # the system stopped: tmpfs is empty
SNAPFG_TEST_BOOT_ID=boot-B start
grep -q 'checkpoint c1: bitmap .*: in use when the system stopped uncleanly' "$pid.log" &&
    info "ok: the log says why c1 is inconsistent" ||
    check_fail "the log does not say c1 was in use at an unclean stop: $(cat "$pid.log")"
ctl "$ctlsock" --json checkpoint list
got=$(jq_py "$tmpdir/ctl.out" '[(c["name"], c["state"]) for c in d["checkpoints"]]')
[ "$got" = '[["c0", "frozen"], ["c1", "inconsistent"]]' ] && info "ok: list: $got" ||
    check_fail "after an unclean stop: $got"
"$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
states = {c["name"]: c["state"] for c in d["checkpoints"]}
sys.exit(0 if states == {"c0": "frozen", "c1": "inconsistent"} else "catalogue: %r" % states)
' "$state" && info "ok: the catalogue records c1 as inconsistent" || check_fail "the catalogue does not record c1 as inconsistent"
ctl_refused "changed --since c1 after an unclean stop" "a full backup is needed" \
    "$ctlsock" changed --since c1
ctl_refused "changed --since c0 (its union holds c1)" "a full backup is needed" \
    "$ctlsock" changed --since c0
if ctl "$ctlsock" --json changed --since c0 s1 && cmp -s "$tmpdir/ctl.out" "$tmpdir/c0-s1.json"; then
    info "ok: c0 -> s1 (frozen and clean) still answers, unchanged"
else
    check_fail "c0 -> s1 after an unclean stop: $(cat "$tmpdir/ctl.out" "$tmpdir/ctl.err")"
fi

info "a new checkpoint after the full backup"
ctl_ok "checkpoint create c2" "$ctlsock" checkpoint create c2
"$PY" - "$(uri "$sock" origin)" <<'EOF'
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\x11" * 512, 5 * 65536 + 512)
h.zero(3 * 65536, 100 * 65536)
h.shutdown()
EOF
echo '[[327680, 65536], [6553600, 196608]]' >"$tmpdir/expect-c2.json"
ctl "$ctlsock" --json changed --since c2 || true
ckio check-changed "$tmpdir/ctl.out" --expect "$tmpdir/expect-c2.json" >"$tmpdir/check.out" 2>&1 &&
    info "ok: c2 is exact: $(cat "$tmpdir/check.out")" || check_fail "c2: $(cat "$tmpdir/check.out")"
stop_nbdkit "$pid"
SNAPFG_TEST_BOOT_ID=boot-C start
ctl "$ctlsock" --json changed --since c2 || true
ckio check-changed "$tmpdir/ctl.out" --expect "$tmpdir/expect-c2.json" >"$tmpdir/check.out" 2>&1 &&
    info "ok: after a clean stop and another boot, c2 is still exact" ||
    check_fail "c2 after a clean stop and another boot: $(cat "$tmpdir/check.out") $(cat "$tmpdir/ctl.err")"
ctl "$ctlsock" --json checkpoint list
got=$(jq_py "$tmpdir/ctl.out" '[(c["name"], c["state"]) for c in d["checkpoints"]]')
[ "$got" = '[["c0", "frozen"], ["c1", "inconsistent"], ["c2", "active"]]' ] &&
    info "ok: c1 stays inconsistent: $got" || check_fail "after another restart: $got"
ctl_ok "drop the inconsistent c1" "$ctlsock" checkpoint drop c1
ctl "$ctlsock" --json checkpoint list
got=$(jq_py "$tmpdir/ctl.out" '[(c["name"], c["state"]) for c in d["checkpoints"]]')
[ "$got" = '[["c0", "inconsistent"], ["c2", "active"]]' ] &&
    info "ok: c0 took over c1's unknown changes: $got" || check_fail "after dropping c1: $got"
ctl_refused "changed --since c0 after c1 was dropped into it" "a full backup is needed" \
    "$ctlsock" changed --since c0
stop_nbdkit "$pid"

# =====================================================================
info "=== 3. a bitmap write error"
SNAPFG_TEST_CBT_WRITE_ERROR=3 start
ctl_ok "checkpoint create c3" "$ctlsock" checkpoint create c3
if "$PY" - "$(uri "$sock" origin)" <<'EOF2'
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for i in range(6):
    h.pwrite(bytes([0x30 + i]) * 4096, (200 + 7 * i) * 65536)
for i in range(6):
    assert h.pread(4096, (200 + 7 * i) * 65536) == bytes([0x30 + i]) * 4096, i
h.shutdown()
EOF2
then
    info "ok: the origin writes succeeded and read back"
else
    check_fail "origin writes failed with a failing bitmap"
fi
grep -q 'c3.cbt is now inconsistent: writing the bitmap failed' "$pid.log" &&
    info "ok: the log says the bitmap write failed" ||
    check_fail "the log does not say c3's bitmap write failed: $(tail -n 5 "$pid.log")"
ctl "$ctlsock" --json checkpoint list
got=$(jq_py "$tmpdir/ctl.out" '[(c["name"], c["state"]) for c in d["checkpoints"]]')
[ "$got" = '[["c0", "inconsistent"], ["c2", "frozen"], ["c3", "inconsistent"]]' ] &&
    info "ok: list: $got" || check_fail "after a bitmap write error: $got"
ctl_refused "changed --since c3 after a bitmap write error" "a full backup is needed" \
    "$ctlsock" changed --since c3
ctl_refused "changed --since c2 (its union holds c3)" "a full backup is needed" \
    "$ctlsock" changed --since c2
"$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
states = {c["name"]: c["state"] for c in d["checkpoints"]}
sys.exit(0 if states.get("c3") == "inconsistent" else "catalogue: %r" % states)
' "$state" && info "ok: the catalogue records c3 as inconsistent" ||
    check_fail "the catalogue does not record c3 as inconsistent"
kill9
start
ctl "$ctlsock" --json checkpoint list
[ "$(jq_py "$tmpdir/ctl.out" '[c["state"] for c in d["checkpoints"] if c["name"] == "c3"]')" = '["inconsistent"]' ] &&
    info "ok: c3 stays inconsistent after a kill -9 and a restart" ||
    check_fail "c3 after a restart: $(cat "$tmpdir/ctl.out")"
stop_nbdkit "$pid"
finish
