#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# state=: a merge of a run-time snapshot interrupted by kill -9 resumes
# at the restart (issue 9 item 4).
#
# A snapshot m1 is created at run time with its store in the state
# directory; origin writes after it (and writes to m1 itself) make m1's
# view differ from the origin.  "merge m1" runs with
# SNAPFG_TEST_CRASH_AT=merge:3, which kills nbdkit (SIGKILL) after the
# third batch.  The restart names only origin=, state= and control=: the
# catalogue brings m1 back as merging before any client is served (the
# first status already says "merging", the first origin read already
# sees m1's view), the merge resumes by itself while a client reads and
# writes the origin, and at the end the origin equals m1's view plus that
# client's acknowledged writes, m1 is gone from the catalogue (event
# "merged") and its store is removed.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

MiB=$((1024 * 1024))
size=$((16 * MiB))
test_files "$size"
state="$tmpdir/catalogue.json"

SNAPFG_TEST_CRASH_AT=merge:3 start_snapfg "$sock" "$pid" origin="$origin" \
    state="$state" control="$ctlsock"
cp "$origin" "$tmpdir/m1.view"
ctl_ok "create m1 (state directory)" "$ctlsock" create m1
make_random_image "$tmpdir/new.img" $((8 * MiB))
nbdcopy -- "$tmpdir/new.img" "$(uri "$sock" origin)" || fail "origin writes failed"
cio writes "$(uri "$sock" m1)" --seed 7 --model "$tmpdir/m1.view" \
    --list "$((12 * MiB)):$((256 * 1024)),$((MiB + 512)):1024" >/dev/null ||
    fail "writes to m1 failed"
export_equals "$(uri "$sock" m1)" "$tmpdir/m1.view" "m1 is the original plus its own writes"
ctl "$ctlsock" merge m1 || true     # the hook may kill nbdkit before the reply
wait_nbdkit_death "$pid" 60
[ "$nbdkit_status" = 137 ] && info "ok: nbdkit killed mid-merge (SIGKILL)" ||
    fail "nbdkit was not killed by the merge:3 hook (status $nbdkit_status)"
jq_py "$state" '[s["state"] for s in d["snapshots"] if s["name"] == "m1"]' >"$tmpdir/st.out"
grep -q merging "$tmpdir/st.out" && info "ok: the catalogue says m1 is merging" ||
    check_fail "the catalogue after the crash: $(cat "$tmpdir/st.out")"
cmp -s "$origin" "$tmpdir/m1.view" && fail "the origin is already merged (the crash came too late)"

info "restart with origin= state= control= only"
rm -f "$ctlsock"
SNAPFG_TEST_MERGE_DELAY_US=20000 start_snapfg "$sock" "$pid" origin="$origin" \
    state="$state" control="$ctlsock"
ctl "$ctlsock" --json status m1 || check_fail "status m1 right after the restart"
[ "$(jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["state"]')" = merging ] &&
    info "ok: the first status after the restart: m1 is merging" ||
    check_fail "right after the restart m1 is not merging: $(cat "$tmpdir/ctl.out")"
cio read "$(uri "$sock" origin)" 0 4096 >/dev/null || check_fail "origin read"
merge_under_io "the merge resumed by itself" "$sock" "$ctlsock" m1 300 \
    "$tmpdir/m1.view" "$tmpdir/model.img" 41
export_equals "$(uri "$sock" origin)" "$tmpdir/model.img" \
    "after the resumed merge the origin is m1's view plus every acknowledged write"
jq_py "$state" '[len(d["snapshots"]), [e["event"] for e in d["events"] if e["name"] == "m1"]]' >"$tmpdir/cat.out"
grep -q '^\[0, .*"merged"' "$tmpdir/cat.out" && info "ok: the catalogue: no snapshots, m1 merged ($(cat "$tmpdir/cat.out"))" ||
    check_fail "the catalogue after the merge: $(cat "$tmpdir/cat.out")"
[ ! -e "$state.d/m1.cow" ] && info "ok: m1's store is removed" || check_fail "m1's store is left"
stop_nbdkit "$pid"
files_equal "$origin" "$tmpdir/model.img" "the origin file after a clean stop"
start_snapfg "$sock" "$pid" origin="$origin" state="$state" control="$ctlsock"
ctl "$ctlsock" --json list || true
[ "$(jq_py "$tmpdir/ctl.out" 'len(d["snapshots"])')" = 0 ] && info "ok: a further restart brings nothing back" ||
    check_fail "after the merge a restart has snapshots: $(cat "$tmpdir/ctl.out")"
stop_nbdkit "$pid"
finish
