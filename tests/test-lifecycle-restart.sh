#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# state= (issue 9 item 2): run-time snapshots survive restarts.
#
# 1. A server with origin=, state= and control= gets snapshots at run
#    time: p1 (persistent, store in the state directory, created without
#    --cow), p2 (persistent, --cow), t1 (transient).  After origin writes
#    and writes to p1 itself, a clean stop and a restart with the same
#    parameters bring back p1 and p2 under their names, byte for byte;
#    t1 is recorded as lost and its state-directory file removed.
# 2. More origin writes, kill -9, restart: p1 and p2 still byte for byte.
# 3. cow= with state=: the start-up snapshot is recorded too and comes
#    back from the catalogue alone (a restart without cow=).
# 4. The catalogue is refused, unchanged, when it is not a snapfg
#    catalogue, when it is malformed, or when it belongs to another
#    origin; a snapshot name that cannot be a file name in the state
#    directory is refused for create without --cow.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

MiB=$((1024 * 1024))
test_files $((8 * MiB))
state="$tmpdir/catalogue.json"
# writeback=off: the writes before the kill -9 below are not flushed.
start() { rm -f "$ctlsock"; start_snapfg "$sock" "$pid" origin="$origin" state="$state" control="$ctlsock" writeback=off "$@"; }
origin_write() { # SEED OFFSET LENGTH
    cio writes "$(uri "$sock" origin)" --seed "$1" --list "$2:$3" >/dev/null ||
        fail "origin write failed"
}

info "=== 1. run-time snapshots across a clean stop"
start
cp "$origin" "$tmpdir/p1.expected"
ctl_ok "create p1 without --cow (state directory)" "$ctlsock" create p1
[ -f "$state.d/p1.cow" ] && info "ok: p1's store is $state.d/p1.cow" ||
    check_fail "p1's store is not in the state directory"
[ "$(stat -c %a "$state.d")" = 700 ] || check_fail "the state directory is mode $(stat -c %a "$state.d"), not 700"
origin_write 1 0 $((2 * MiB))
cp "$origin" "$tmpdir/p2.expected"
ctl_ok "create p2 --cow" "$ctlsock" create p2 --cow "$tmpdir/p2.cow" --chunk-size 64K
ctl_ok "create t1 (transient, state directory)" "$ctlsock" create t1 --store transient
origin_write 2 $((1 * MiB)) $((4 * MiB))
cio writes "$(uri "$sock" p1)" --seed 3 --model "$tmpdir/p1.expected" \
    --list "$((6 * MiB)):65536,$((1 * MiB + 512)):1024" >/dev/null || fail "writes to p1 failed"
export_equals "$(uri "$sock" p1)" "$tmpdir/p1.expected" "p1 before the restart"
stop_nbdkit "$pid"
start
ctl "$ctlsock" --json list || check_fail "list after the restart"
names=$(jq_py "$tmpdir/ctl.out" '" ".join(sorted(s["name"] for s in d["snapshots"]))')
[ "$names" = "p1 p2" ] && info "ok: after a clean restart: p1 and p2 are back, t1 is not" ||
    check_fail "after the restart the snapshots are '$names', expected 'p1 p2'"
export_equals "$(uri "$sock" p1)" "$tmpdir/p1.expected" "p1 after a clean restart (with its own writes)"
export_equals "$(uri "$sock" p2)" "$tmpdir/p2.expected" "p2 after a clean restart"
jq_py "$state" '[e["name"] for e in d["events"] if e["event"] == "lost"]' >"$tmpdir/lost.out"
grep -q '"t1"' "$tmpdir/lost.out" && info "ok: the catalogue records t1 as lost" ||
    check_fail "the catalogue does not record t1 as lost: $(cat "$tmpdir/lost.out")"
[ ! -e "$state.d/t1.cow" ] && info "ok: t1's state-directory file is removed" ||
    check_fail "t1's file $state.d/t1.cow is left"

info "=== 2. across kill -9"
origin_write 4 0 $((8 * MiB))
kill -KILL "$(nbdkit_pid "$pid")"
wait_nbdkit_death "$pid" 30
start
export_equals "$(uri "$sock" p1)" "$tmpdir/p1.expected" "p1 after kill -9"
export_equals "$(uri "$sock" p2)" "$tmpdir/p2.expected" "p2 after kill -9"
ctl_ok "drop p1" "$ctlsock" drop p1
[ ! -e "$state.d/p1.cow" ] && info "ok: dropping p1 removed its state-directory store" ||
    check_fail "p1's store is left after drop"
grep -q 'state directory is removed' "$tmpdir/ctl.out" &&
    info "ok: snapfgctl drop says the state-directory store is removed" ||
    check_fail "snapfgctl drop p1 said: $(cat "$tmpdir/ctl.out")"
ctl_ok "create p1 again without --cow (a new snapshot)" "$ctlsock" create p1
stop_nbdkit "$pid"

info "=== 3. cow= with state="
cp "$origin" "$tmpdir/snap.expected"
start cow="$tmpdir/snap.cow"
origin_write 5 0 $((3 * MiB))
stop_nbdkit "$pid"
start
listed "$sock" snapshot && info "ok: the cow= snapshot came back from the catalogue alone" ||
    check_fail "the cow= snapshot is not back without cow="
export_equals "$(uri "$sock" snapshot)" "$tmpdir/snap.expected" "the cow= snapshot, back from the catalogue"
stop_nbdkit "$pid"
start cow="$tmpdir/snap.cow"
export_equals "$(uri "$sock" snapshot)" "$tmpdir/snap.expected" "the cow= snapshot, given again with state="
ctl_refused "create a/b without --cow" "file name" "$ctlsock" create a/b
stop_nbdkit "$pid"

info "=== 4. catalogues that are refused"
# refuse_catalogue WHAT FILE MSG
refuse_catalogue() {
    local sum
    sum=$(checksum "$2")
    if try_start_failure "$tmpdir/start.err" origin="$origin" state="$2"; then
        try_stderr "$tmpdir/start.err" "$2" "$3" &&
            info "ok: $1: refused: $(grep -m1 "$3" "$tmpdir/start.err")"
    fi
    [ "$(checksum "$2")" = "$sum" ] || check_fail "$1: the file was changed"
}
echo "precious, not a catalogue" >"$tmpdir/not-json"
refuse_catalogue "a file that is not a catalogue" "$tmpdir/not-json" "not a snapfg catalogue"
echo '{"format":"something-else","version":1}' >"$tmpdir/other.json"
refuse_catalogue "JSON of another format" "$tmpdir/other.json" "not a snapfg catalogue"
"$PY" -c '
import json, sys
d = json.load(open(sys.argv[1])); d["snapshots"] = {"p2": 1}
json.dump(d, open(sys.argv[2], "w"))' "$state" "$tmpdir/malformed.json"
refuse_catalogue "a malformed catalogue" "$tmpdir/malformed.json" "malformed"
make_random_image "$tmpdir/other-origin.img" $((8 * MiB))
start_snapfg "$sock" "$pid" origin="$tmpdir/other-origin.img" state="$tmpdir/foreign.json"
stop_nbdkit "$pid"
refuse_catalogue "the catalogue of another origin" "$tmpdir/foreign.json" "belongs to origin"
finish
