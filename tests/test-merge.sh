#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfgctl merge: a persistent snapshot is merged back into the origin.
#
# 1. Live merge under concurrent I/O.  A 32 MiB origin, snapshot snap1
#    (persistent, 4K chunks) created at run time, 24 MiB of origin writes
#    after it (6144 exceptions) and some writes to the snapshot itself
#    (256 more), so the merge takes several hundred batches of 16 chunks.
#    The expected origin after "merge" is the snapshot's view; two
#    clients then read and write the origin (disjoint halves) while the
#    merge runs, every read compared with a model (the snapshot's view
#    overlaid with their own writes).  A watcher polls status every 10 ms:
#    state "merging" with merge_done rising to merge_total.  Meanwhile
#    create, drop and a second merge are refused.  At the end snap1 is
#    gone (status, nbdinfo --list, its export), the origin equals the
#    model, and a new snapshot can be created again.
# 2. Killed midway.  nbdkit runs with SNAPFG_TEST_CRASH_AT=merge:3 and
#    dies (SIGKILL) after the third batch is copied into the origin but
#    before it leaves the COW table: the table then holds exactly 32
#    exceptions fewer (two batches).  Restarted without the hook, with
#    the same origin= and cow=, the merge resumes by itself (with a
#    client doing I/O on the origin meanwhile) and the origin ends equal
#    to the snapshot's view plus that client's writes.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

MiB=$((1024 * 1024))

# expected_exceptions COW: "exceptions: N" of snapfgctl inspect.
inspect_exceptions() {
    "$SNAPFGCTL" inspect "$1" >"$tmpdir/inspect.out" 2>&1 || {
        cat "$tmpdir/inspect.out" >&2
        echo "inspect-failed"
        return 0
    }
    sed -n 's/^exceptions: //p' "$tmpdir/inspect.out"
}

# snapshot_exceptions SOCK NAME: the exception count status reports.
snapshot_exceptions() {
    ctl "$1" --json status "$2" || { echo "status-failed"; return 0; }
    jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["exceptions"]'
}

# combine_halves A B OUT: the first half of A and the second half of B.
combine_halves() {
    "$PY" -c '
import sys
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
h = len(a) // 2
open(sys.argv[3], "wb").write(a[:h] + b[h:])
' "$1" "$2" "$3"
}

# =====================================================================
info "=== 1. merge under concurrent origin I/O"
size=$((32 * MiB))
cow1="$tmpdir/snap1.cow"
test_files "$size"
make_random_image "$tmpdir/new-data.img" $((24 * MiB))

# Each merge batch (16 chunks) takes at least 5 ms, so that the checks
# below run while the merge is certainly still going (>= 2 s).  Under a
# sanitizer 25 ms (>= 10 s): there each snapfgctl the checks run is
# instrumented too, and on a loaded machine the five of them once took
# longer than the whole 2 s merge (the status found snap1 gone, and the
# create that must be refused during a merge was accepted after it).
merge_delay_us=$([ -n "${SNAPFG_SANITIZER:-}" ] && echo 25000 || echo 5000)
SNAPFG_TEST_MERGE_DELAY_US=$merge_delay_us \
    start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock"
ctl_ok "create snap1 (persistent, chunk 4K)" "$ctlsock" create snap1 --cow "$cow1" --chunk-size 4096

info "writing 24 MiB to the origin (6144 copy-outs)"
nbdcopy -- "$tmpdir/new-data.img" "$(uri "$sock" origin)" ||
    fail "nbdcopy into the origin failed"
cp "$orig" "$tmpdir/snapview.img"
cio writes "$(uri "$sock" snap1)" --seed 11 --model "$tmpdir/snapview.img" \
    --list "$((28 * MiB)):$MiB,$((4 * MiB + 512)):2048,$((31 * MiB)):512" >/dev/null ||
    fail "writes to snap1 failed"
n=$(snapshot_exceptions "$ctlsock" snap1)
[ "$n" = 6401 ] && info "ok: snap1 holds 6401 exceptions (6144 + 256 + 1)" ||
    check_fail "snap1 holds '$n' exceptions, expected 6401"
export_equals "$(uri "$sock" snap1)" "$tmpdir/snapview.img" "before the merge, snap1 is the original plus its own writes"

ctl_ok "create snap2 (transient)" "$ctlsock" create snap2 --cow "$tmpdir/snap2.cow" --store transient
ctl_refused "merge while two snapshots exist" "only snapshot" "$ctlsock" merge snap1
ctl_refused "merge of the transient snap2" "persistent" "$ctlsock" merge snap2
ctl_ok "drop snap2" "$ctlsock" drop snap2

ctl_ok "merge snap1" "$ctlsock" merge snap1
"$PY" "$CTL_PROTO" watch "$ctlsock" snap1 --timeout 90 --expect-merging \
    >"$tmpdir/watch.out" 2>&1 &
watch_pid=$!
cp "$tmpdir/snapview.img" "$tmpdir/model-a.img"
cp "$tmpdir/snapview.img" "$tmpdir/model-b.img"
for h in a b; do
    case $h in a) region="0:$((size / 2))" seed=21 ;; b) region="$((size / 2)):$((size / 2))" seed=22 ;; esac
    "$PY" "$CTL_IO" io-loop "$(uri "$sock" origin)" --seed "$seed" --region "$region" \
        --model "$tmpdir/model-$h.img" --stop-file "$tmpdir/stop1" --min-ops 200 \
        >"$tmpdir/io-$h.out" 2>&1 &
    eval "io_$h=\$!"
done

# While it merges: human status shows the progress; nothing else may
# change the set of snapshots.
ctl "$ctlsock" --json status snap1 || true
state=$(jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["state"] if d["ok"] else "gone"' 2>/dev/null || echo gone)
if [ "$state" = merging ]; then
    json_ok "status --json while merging" "$tmpdir/ctl.out"
    ctl "$ctlsock" status snap1 || true
    if grep -qE '^snap1: merging, .*; merged [0-9]+ of 6401 chunks$' "$tmpdir/ctl.out"; then
        info "ok: status while merging: $(cat "$tmpdir/ctl.out")"
    else
        check_fail "status while merging lacks 'snap1: merging, ... merged N of 6401 chunks': $(cat "$tmpdir/ctl.out")"
    fi
    ctl_refused "create during the merge" "merged" "$ctlsock" create snap3 --cow "$tmpdir/snap3.cow"
    ctl_refused "drop of the merging snapshot" "merged" "$ctlsock" drop snap1
    ctl_refused "a second merge of snap1" "already being merged" "$ctlsock" merge snap1
    # A refused create leaves no COW file behind (as everywhere else:
    # test-checkpoint, test-control-limits, test-create-enomem).
    [ ! -e "$tmpdir/snap3.cow" ] ||
        check_fail "the refused create left $(basename "$tmpdir/snap3.cow") behind ($(file_size "$tmpdir/snap3.cow") bytes)"
    rm -f "$tmpdir/snap3.cow"
else
    check_fail "snap1 is not merging right after merge returned (state '$state'): cannot check status and refusals during the merge"
fi

st=0; wait "$watch_pid" || st=$?
cat "$tmpdir/watch.out"
[ "$st" -eq 0 ] && info "ok: the merge progressed monotonically and snap1 went away by itself" ||
    check_fail "watching the merge found problems (above)"
touch "$tmpdir/stop1"
for h in a b; do
    st=0; eval "wait \$io_$h" || st=$?
    cat "$tmpdir/io-$h.out"
    [ "$st" -eq 0 ] && info "ok: client $h: every origin read during the merge equalled the snapshot's view plus its writes" ||
        check_fail "client $h: origin I/O during the merge went wrong (above)"
done
combine_halves "$tmpdir/model-a.img" "$tmpdir/model-b.img" "$tmpdir/expected1.img"

ctl "$ctlsock" --json list || check_fail "list after the merge"
json_ok "list --json after the merge" "$tmpdir/ctl.out"
[ "$(jq_py "$tmpdir/ctl.out" 'len(d["snapshots"])')" = 0 ] &&
    info "ok: no snapshot left in list after the merge" ||
    check_fail "snapshots left after the merge: $(cat "$tmpdir/ctl.out")"
! listed "$sock" snap1 && info "ok: snap1 is gone from nbdinfo --list" ||
    check_fail "snap1 still in nbdinfo --list after the merge"
if nbdinfo "$(uri "$sock" snap1)" >/dev/null 2>&1; then
    check_fail "export snap1 still served after the merge"
else
    info "ok: export snap1 refused after the merge"
fi
ctl_refused "status of the merged snapshot" "no snapshot named" "$ctlsock" status snap1
export_equals "$(uri "$sock" origin)" "$tmpdir/expected1.img" "after the merge the origin equals the snapshot's view plus the writes made during the merge"
n=$(inspect_exceptions "$cow1")
[ "$n" = 0 ] && info "ok: the merged COW store's table is empty" ||
    check_fail "the merged COW store still has '$n' exceptions"
ctl_ok "a new snapshot can be created after the merge" "$ctlsock" create snap3 --cow "$tmpdir/snap3.cow"
export_equals "$(uri "$sock" snap3)" "$tmpdir/expected1.img" "the new snapshot sees the merged origin"
ctl_ok "drop snap3" "$ctlsock" drop snap3
stop_nbdkit "$pid"
files_equal "$origin" "$tmpdir/expected1.img" "the origin file itself equals the expected contents after a clean exit"

# =====================================================================
info "=== 2. nbdkit killed mid-merge (SNAPFG_TEST_CRASH_AT=merge:3), restarted"
size=$((16 * MiB))
origin="$tmpdir/origin2.img"
orig="$tmpdir/original2.img"
cow="$tmpdir/snapk.cow"
make_random_image "$origin" "$size"
cp "$origin" "$orig"
make_random_image "$tmpdir/new-data2.img" $((8 * MiB))

SNAPFG_TEST_CRASH_AT=merge:3 start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock"
ctl_ok "create snapk (persistent)" "$ctlsock" create snapk --cow "$cow"
nbdcopy -- "$tmpdir/new-data2.img" "$(uri "$sock" origin)" || fail "nbdcopy into the origin failed"
cp "$orig" "$tmpdir/snapview2.img"
cio writes "$(uri "$sock" snapk)" --seed 12 --model "$tmpdir/snapview2.img" \
    --list "$((12 * MiB)):$((512 * 1024)),$((MiB + 1024)):1024" >/dev/null ||
    fail "writes to snapk failed"
n=$(snapshot_exceptions "$ctlsock" snapk)
[ "$n" = 2176 ] && info "ok: snapk holds 2176 exceptions (2048 + 128)" ||
    check_fail "snapk holds '$n' exceptions, expected 2176"
export_equals "$(uri "$sock" snapk)" "$tmpdir/snapview2.img" "snapk is the original plus its own writes"

st=0; ctl "$ctlsock" merge snapk || st=$?
# The merge thread may kill nbdkit before the reply goes out.
[ "$st" -eq 0 ] || grep -q "no reply" "$tmpdir/ctl.err" ||
    check_fail "merge snapk: $(cat "$tmpdir/ctl.err")"
wait_nbdkit_death "$pid" 30
case $nbdkit_status in
    137) info "ok: nbdkit was killed (SIGKILL) by the merge:3 hook" ;;
    alive) fail "nbdkit still runs 30 s after the merge started (hook merge:3 not reached?)" ;;
    *) check_fail "nbdkit exited with status $nbdkit_status, expected 137 (SIGKILL)" ;;
esac
n=$(inspect_exceptions "$cow")
[ "$n" = $((2176 - 32)) ] &&
    info "ok: after the crash the COW table holds $n exceptions: two batches of 16 removed, the third (copied, not yet removed) still there" ||
    check_fail "after the crash the COW table holds '$n' exceptions, expected $((2176 - 32))"
rm -f "$ctlsock"    # a SIGKILLed server leaves its socket behind

info "restarting without the hook: origin=$origin cow=$cow"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" control="$ctlsock"
merge_under_io "the merge resumed by itself after the restart" "$sock" "$ctlsock" \
    snapshot 90 "$tmpdir/snapview2.img" "$tmpdir/model2.img" 31
! listed "$sock" snapshot && info "ok: the merged snapshot is gone from nbdinfo --list" ||
    check_fail "the snapshot is still listed after the resumed merge"
export_equals "$(uri "$sock" origin)" "$tmpdir/model2.img" "after the resumed merge the origin equals the snapshot's view (plus the writes made meanwhile)"
n=$(inspect_exceptions "$cow")
[ "$n" = 0 ] && info "ok: the COW table is empty after the resumed merge" ||
    check_fail "the COW table holds '$n' exceptions after the resumed merge"
stop_nbdkit "$pid"
files_equal "$origin" "$tmpdir/model2.img" "the origin file equals the expected contents after a clean exit"

finish
