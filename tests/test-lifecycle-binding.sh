#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Store bindings (issue 9 items 2, 3, 4, 13): a persistent store is never
# attached as a valid snapshot when the origin may have changed while it
# was not attached.  Every refusal names the file, and writes nothing.
#
# 1. drop, then origin writes, then "create NAME --cow SAMEFILE" (and a
#    restart with cow=SAMEFILE): refused; the dropped store says valid 0
#    and binding state "dropped" (snapfgctl inspect).
# 2. A store created at run time without state= and forgotten at the
#    restart: snapshot=NAME:COW and cow= refuse it.
# 3. A store copied from another origin: refused at start-up and at run
#    time ("belongs to another origin").
# 4. A merge of a run-time snapshot interrupted by kill -9: "create s2
#    --cow" on the merge-marked store is refused, and the origin's
#    checksum (file and export) is unchanged.
# 5. A store bound to a catalogue is refused without its state= file.
# 6. A store in dm's format without a binding record (as the kernel
#    writes it) still opens with cow= and gets a binding.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
source "$(dirname "$0")/persistent-functions.sh"

MiB=$((1024 * 1024))
test_files $((8 * MiB))
start() { rm -f "$ctlsock"; start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock" "$@"; }
origin_write() { # SEED OFFSET LENGTH
    cio writes "$(uri "$sock" origin)" --seed "$1" --list "$2:$3" >/dev/null ||
        fail "origin write failed"
}
# start_refused WHAT FILE MSG PARAMS...: nbdkit refuses, naming FILE
# with MSG, and FILE is unchanged.
start_refused() {
    local what=$1 file=$2 msg=$3 sum
    shift 3
    sum=$(checksum "$file")
    if try_start_failure "$tmpdir/start.err" "$@"; then
        try_stderr "$tmpdir/start.err" "$file" "$msg" &&
            info "ok: $what: refused: $(grep -m1 -F "$msg" "$tmpdir/start.err")"
    fi
    [ "$(checksum "$file")" = "$sum" ] || check_fail "$what: $file was changed"
}
# create_refused WHAT FILE MSG NAME: a run-time create refused, FILE unchanged.
create_refused() {
    local sum
    sum=$(checksum "$2")
    ctl_refused "$1" "$3" "$ctlsock" create "$4" --cow "$2"
    grep -qF "$2" "$tmpdir/ctl.err" || check_fail "$1: the error does not name $2"
    [ "$(checksum "$2")" = "$sum" ] || check_fail "$1: $2 was changed"
    listed "$sock" "$4" && check_fail "$1: $4 is listed after the refusal" || true
}

info "=== 1. drop, origin writes, reopen the same store"
start
C="$tmpdir/s1.cow"
ctl_ok "create s1 --cow" "$ctlsock" create s1 --cow "$C"
origin_write 1 0 $((1 * MiB))
ctl_ok "drop s1" "$ctlsock" drop s1
"$SNAPFGCTL" inspect "$C" >"$tmpdir/inspect.out" 2>&1 || check_fail "inspect the dropped store"
grep -q '^valid: 0$' "$tmpdir/inspect.out" && grep -q '^binding: snapshot s1,.* state dropped' "$tmpdir/inspect.out" &&
    info "ok: the dropped store: valid 0, binding state dropped" ||
    check_fail "the dropped store: $(grep -E '^(valid|binding)' "$tmpdir/inspect.out" | tr '\n' ' ')"
origin_write 2 $((2 * MiB)) $((1 * MiB))
create_refused "create s1 --cow on the dropped store" "$C" "dropped" s1
stop_nbdkit "$pid"
start_refused "cow= on the dropped store" "$C" "dropped" origin="$origin" cow="$C"
start_refused "snapshot= on the dropped store, with state=" "$C" "dropped" \
    origin="$origin" snapshot="s1:$C" state="$tmpdir/state1.json"

info "=== 2. a run-time store forgotten at restart"
start
F="$tmpdir/s2.cow"
ctl_ok "create s2 --cow (no state=)" "$ctlsock" create s2 --cow "$F"
origin_write 3 0 $((1 * MiB))
stop_nbdkit "$pid"
start
origin_write 4 $((4 * MiB)) $((2 * MiB))    # while s2 is not attached
create_refused "create s2 --cow on the forgotten store" "$F" "already holds a snapshot store" s2
stop_nbdkit "$pid"
start_refused "snapshot=s2:COW on the forgotten store" "$F" "created at run time" \
    origin="$origin" snapshot="s2:$F"
start_refused "cow= on the forgotten store" "$F" "created at run time" origin="$origin" cow="$F"

info "=== 3. a store of another origin"
other="$tmpdir/other.img"; cp "$origin" "$other"
start_snapfg "$tmpdir/sock2" "$tmpdir/nbdkit2.pid" origin="$other" cow="$tmpdir/other.cow"
nbdcopy -- <(head -c $MiB /dev/urandom) "$(uri "$tmpdir/sock2" origin)" || fail "writing the other origin"
stop_nbdkit "$tmpdir/nbdkit2.pid"
cp "$tmpdir/other.cow" "$tmpdir/foreign.cow"
start_refused "cow= on a store copied from another origin" "$tmpdir/foreign.cow" \
    "belongs to another origin" origin="$origin" cow="$tmpdir/foreign.cow"
start
create_refused "create --cow on a store of another origin" "$tmpdir/foreign.cow" "already holds" s3
stop_nbdkit "$pid"

info "=== 4. create on a merge-marked store"
M="$tmpdir/m1.cow"
SNAPFG_TEST_CRASH_AT=merge:2 start
ctl_ok "create m1 --cow" "$ctlsock" create m1 --cow "$M"
origin_write 5 0 $((4 * MiB))
ctl "$ctlsock" merge m1 || true     # nbdkit may die before it replies
wait_nbdkit_death "$pid" 60
[ "$nbdkit_status" = 137 ] || fail "nbdkit was not killed mid-merge (status $nbdkit_status)"
grep -q '^merge mark' <("$SNAPFGCTL" inspect "$M") || check_fail "the store has no merge mark after the crash"
start
sum_file=$(checksum "$origin")
nbdcopy -- "$(uri "$sock" origin)" "$tmpdir/origin-before.img" || fail "reading the origin"
create_refused "create s2 --cow on the merge-marked store" "$M" "merge in progress" s2
nbdcopy -- "$(uri "$sock" origin)" "$tmpdir/origin-after.img" || fail "reading the origin"
files_equal "$tmpdir/origin-before.img" "$tmpdir/origin-after.img" "the origin's view is unchanged by the refused create"
[ "$(checksum "$origin")" = "$sum_file" ] && info "ok: the origin file's checksum is unchanged" ||
    check_fail "the origin file changed"
ctl_ok "create s3 (a new store) still works" "$ctlsock" create s3 --cow "$tmpdir/s3.cow"
ctl_ok "drop s3" "$ctlsock" drop s3
stop_nbdkit "$pid"
start cow="$M"      # finish the merge (test-merge.sh checks the data)
wait_until 120 bash -c "! nbdinfo --list '$(uri "$sock")' | grep -q 'export=\"snapshot\"'" ||
    check_fail "the resumed merge did not finish"
stop_nbdkit "$pid"

info "=== 5. a catalogue's store without its catalogue"
K="$tmpdir/k.cow"
start_snapfg "$sock" "$pid" origin="$origin" cow="$K" state="$tmpdir/state5.json"
stop_nbdkit "$pid"
start_refused "cow= on a catalogue's store without state=" "$K" "belongs to a catalogue" \
    origin="$origin" cow="$K"
start_refused "cow= on a catalogue's store with another catalogue" "$K" "another catalogue" \
    origin="$origin" cow="$K" state="$tmpdir/state5b.json"
[ ! -e "$tmpdir/state5b.json" ] && info "ok: the refused start left no new catalogue behind" ||
    check_fail "the refused start left $tmpdir/state5b.json"

info "=== 6. a store without a binding record (as the kernel writes one)"
make_cow build --origin "$origin" --chunk-size 4096 --exceptions 100 \
    --out "$tmpdir/dm.cow" --expected "$tmpdir/dm.expected" >/dev/null || fail "make-cow.py build"
grep -q '^binding: none' <("$SNAPFGCTL" inspect "$tmpdir/dm.cow") ||
    check_fail "make-cow.py's store has a binding record?"
start cow="$tmpdir/dm.cow"
export_equals "$(uri "$sock" snapshot)" "$tmpdir/dm.expected" "a store without a binding opens with cow="
stop_nbdkit "$pid"
grep -q '^binding: snapshot snapshot,.* start-up, state attached' <("$SNAPFGCTL" inspect "$tmpdir/dm.cow") &&
    info "ok: it has a start-up binding now" || check_fail "no binding written: $("$SNAPFGCTL" inspect "$tmpdir/dm.cow" | grep binding)"
finish
