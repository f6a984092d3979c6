#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The file system holding a persistent COW store fills up (a small
# tmpfs; skipped if this machine cannot mount one).
#
# A. Snapshot writes fill it: each write that finds no room fails with
#    ENOSPC, the snapshot stays valid with status Overflow (its header
#    still says valid = 1), every chunk it preserved before and every
#    snapshot write that succeeded reads back byte for byte; writes into
#    chunks the snapshot already holds still work.  After a clean stop
#    and a restart on the still-full file system the store reopens
#    valid, with the same data and exceptions.  Then an origin write that
#    needs a copy-out finds no room: the snapshot becomes Invalid (also
#    on disk), the origin write succeeds (docs/design.md section 6).
# B. The room runs out exactly when the exception table must zero its
#    next metadata area (256 exceptions of 4K: area 2): the snapshot
#    write whose exception needs it fails with ENOSPC and the snapshot
#    stays valid and intact; a restart reopens it valid.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
requires mount umount

chunk=4096
size=$((4 * 1024 * 1024))
test_files
mnt="$tmpdir/mnt"
mkdir "$mnt"

# mount_small PAGES: a fresh tmpfs of PAGES pages of 4 KiB at $mnt.
mounted=false
mount_small() {
    if $mounted; then umount "$mnt"; mounted=false; fi
    mount -t tmpfs -o "size=$(($1 * 4096)),mode=0700" tmpfs "$mnt" 2>"$tmpdir/mount.err" ||
        skip "cannot mount a tmpfs: $(cat "$tmpdir/mount.err")"
    mounted=true
}
on_exit '$mounted && umount -l "$mnt"'

snap_state() {
    ctl "$ctlsock" --json status "$1" || { echo "status-failed"; return 0; }
    jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["state"]'
}

# expect_state NAME STATE WHAT
expect_state() {
    local st
    st=$(snap_state "$1")
    [ "$st" = "$2" ] && info "ok: $3: $1 is $st" || check_fail "$3: $1 is '$st', expected $2"
}

# header_valid COW: the dm header's valid word.
header_valid() { header_le32 "$1" 4; }
header_le32() { od -An -t u4 --endian=little -j "$2" -N 4 "$1" | tr -d ' '; }

# exceptions COW: the count snapfgctl inspect reads from the store.
exceptions() {
    "$SNAPFGCTL" inspect "$1" >"$tmpdir/inspect.out" 2>&1 || { echo "inspect-failed"; return 0; }
    sed -n 's/^exceptions: //p' "$tmpdir/inspect.out"
}

# --- A ----------------------------------------------------------------
info "=== A. snapshot writes fill a tmpfs of 128 pages"
mount_small 128
cow="$mnt/a.cow"
make_random_image "$origin" "$size"
cp "$origin" "$tmpdir/snapview.img"     # the snapshot's model
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size=$chunk control="$ctlsock"
# 40 origin chunks change: the snapshot preserves their old data.
failures_io write "$(uri "$sock" origin)" 0 $((40 * chunk)) --seed 1 >/dev/null ||
    fail "origin write of 40 chunks failed"
# With write-back the file holds the write once a flush covered it.
failures_io flush "$(uri "$sock" origin)" >/dev/null || fail "origin flush failed"
cp "$origin" "$tmpdir/origin-model.img"
# 200 whole-chunk snapshot writes, far more than the room left.
failures_io writes "$(uri "$sock" snapshot)" --chunks 100:200 --chunk-size $chunk --seed 2 \
    --model "$tmpdir/snapview.img" --results "$tmpdir/a.results" >"$tmpdir/a.counts"
info "snapshot writes: $(cat "$tmpdir/a.counts")"
ok=$(grep -c ' ok$' "$tmpdir/a.results" || true)
nospc=$(grep -c ' ENOSPC$' "$tmpdir/a.results" || true)
[ "$ok" -gt 0 ] && [ "$nospc" -gt 0 ] && [ $((ok + nospc)) = 200 ] &&
    info "ok: $ok snapshot writes succeeded, then $nospc failed with ENOSPC" ||
    check_fail "snapshot writes: $(cat "$tmpdir/a.counts") (expected some ok, then only ENOSPC)"
# Once one failed, every later one failed too (none half-succeeded).
awk '$2 != "ok" { bad = 1 } bad && $2 == "ok" { exit 1 }' "$tmpdir/a.results" ||
    check_fail "a snapshot write succeeded after one had failed with ENOSPC"
failures_io write "$(uri "$sock" snapshot)" $((300 * chunk + 512)) 1024 --seed 3 --expect ENOSPC >/dev/null ||
    check_fail "a sub-chunk snapshot write needing a copy-out on the full file system did not fail with ENOSPC"
expect_state snapshot Overflow "after the file system filled"
failures_io write "$(uri "$sock" snapshot)" $((5 * chunk + 512)) 1024 --seed 4 --model "$tmpdir/snapview.img" >/dev/null ||
    check_fail "a snapshot write into a chunk the snapshot holds (preserved) failed"
failures_io write "$(uri "$sock" snapshot)" $((100 * chunk)) $chunk --seed 5 --model "$tmpdir/snapview.img" >/dev/null ||
    check_fail "a snapshot write into a chunk the snapshot holds (written) failed"
export_equals "$(uri "$sock" snapshot)" "$tmpdir/snapview.img" "the overflowed snapshot: every preserved chunk and every successful write intact"
export_equals "$(uri "$sock" origin)" "$tmpdir/origin-model.img" "the origin is unaffected"
[ "$(header_valid "$cow")" = 1 ] && info "ok: the store's header still says valid" ||
    check_fail "the store's header says valid = $(header_valid "$cow") after snapshot writes hit ENOSPC"
stop_nbdkit "$pid"
n=$(exceptions "$cow")
[ "$n" = $((40 + ok)) ] && info "ok: the store holds $n exceptions (40 preserved + $ok written)" ||
    check_fail "the store holds '$n' exceptions, expected $((40 + ok))"

info "restart on the full file system"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size=$chunk control="$ctlsock"
expect_state snapshot valid "after the restart"
export_equals "$(uri "$sock" snapshot)" "$tmpdir/snapview.img" "after the restart the snapshot holds the same data"
failures_io write "$(uri "$sock" snapshot)" $((310 * chunk)) $chunk --seed 6 --expect ENOSPC >/dev/null ||
    check_fail "after the restart a snapshot write needing a new chunk did not fail with ENOSPC"
expect_state snapshot Overflow "after the restart and a write that found no room"
# An origin write needing a copy-out: the snapshot cannot keep the old
# data, so it is lost (Invalid), and the origin write goes ahead.
failures_io write "$(uri "$sock" origin)" $((500 * chunk)) $chunk --seed 7 --model "$tmpdir/origin-model.img" >/dev/null ||
    check_fail "an origin write needing a copy-out on the full file system failed"
expect_state snapshot Invalid "after an origin write found no room for its copy-out"
failures_io read "$(uri "$sock" snapshot)" 0 $chunk --expect EIO >/dev/null ||
    check_fail "a read of the Invalid snapshot did not fail with EIO"
export_equals "$(uri "$sock" origin)" "$tmpdir/origin-model.img" "the origin holds every write"
stop_nbdkit "$pid"
[ "$(header_valid "$cow")" = 0 ] && info "ok: the Invalid snapshot is recorded in the header (valid = 0)" ||
    check_fail "the store's header says valid = $(header_valid "$cow") after the snapshot became Invalid"

# --- B ----------------------------------------------------------------
# Header, area 0, area 1 (zeroed when the store is made) and 256 data
# chunks: 259 pages.  The 256th exception fills area 0, and its commit
# must first zero area 2, for which there is no room.
info "=== B. the room runs out when metadata area 2 must be zeroed"
mount_small 259
cow="$mnt/b.cow"
make_random_image "$origin" "$size"
cp "$origin" "$tmpdir/snapview.img"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size=$chunk control="$ctlsock"
failures_io write "$(uri "$sock" origin)" 0 $((40 * chunk)) --seed 11 >/dev/null ||
    fail "origin write of 40 chunks failed"
failures_io writes "$(uri "$sock" snapshot)" --chunks 100:230 --chunk-size $chunk --seed 12 \
    --model "$tmpdir/snapview.img" --results "$tmpdir/b.results" >"$tmpdir/b.counts"
info "snapshot writes: $(cat "$tmpdir/b.counts")"
first_fail=$(awk '$2 != "ok" { print $1 - 100 + 40 + 1; exit }' "$tmpdir/b.results")
info "the first snapshot write to fail would have made exception number ${first_fail:-none}"
ok=$(grep -c ' ok$' "$tmpdir/b.results" || true)
[ "$ok" = 215 ] && info "ok: 215 snapshot writes succeeded (exceptions 41-255)" ||
    check_fail "expected exactly 215 snapshot writes to succeed (the 256th exception needs area 2), got $ok"
grep -v ' ok$' "$tmpdir/b.results" | grep -qv ' ENOSPC$' &&
    check_fail "a snapshot write failed with another error than ENOSPC: $(grep -v ' ok$' "$tmpdir/b.results" | grep -v ' ENOSPC$' | head -n3)"
expect_state snapshot Overflow "after the exception table found no room"
export_equals "$(uri "$sock" snapshot)" "$tmpdir/snapview.img" "the snapshot holds every preserved chunk and every successful write"
stop_nbdkit "$pid"
[ "$(header_valid "$cow")" = 1 ] && info "ok: the store's header still says valid" ||
    check_fail "the store's header says valid = $(header_valid "$cow")"
n=$(exceptions "$cow")
[ "$n" = $((40 + ok)) ] && info "ok: the store holds $n exceptions" ||
    check_fail "the store holds '$n' exceptions, expected $((40 + ok))"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size=$chunk control="$ctlsock"
expect_state snapshot valid "after the restart"
export_equals "$(uri "$sock" snapshot)" "$tmpdir/snapview.img" "after the restart the snapshot holds the same data"
stop_nbdkit "$pid"

finish
