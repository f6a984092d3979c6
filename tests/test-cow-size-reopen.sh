#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Reopening a persistent store with a cow-size= smaller than what the
# store already uses is refused at start-up (cow= and snapshot=NAME:COW;
# a run-time create never reopens a store), with an error naming the COW
# file and both sizes; the file is left byte for byte unchanged.  (It used to be accepted, and the next
# origin write that needed a copy-out made the snapshot Invalid.)  A
# cow-size= that holds what is used, or none, reopens the snapshot with
# its data intact.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

chunk=4096
size=$((4 * 1024 * 1024))
test_files "$size"
cow="$tmpdir/snap.cow"
make_random_image "$tmpdir/new.img" $((100 * chunk))

# 100 copy-outs: the store uses its header, area 0 and 100 data chunks.
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size=$chunk
nbdcopy -- "$tmpdir/new.img" "$(uri "$sock" origin)" || fail "nbdcopy into the origin failed"
stop_nbdkit "$pid"
used=$(((2 + 100) * chunk))
small=$((64 * chunk))
sum=$(checksum "$cow")

# --- at start-up ------------------------------------------------------
err="$tmpdir/start.err"
if try_start_failure "$err" origin="$origin" cow="$cow" chunk-size=$chunk cow-size=$small; then
    info "ok: start-up with cow-size=$small refused: $(grep -m1 cow-size "$err" || head -n1 "$err")"
    try_stderr "$err" "$cow" "$small" "$used"
fi
[ "$(checksum "$cow")" = "$sum" ] && info "ok: the COW file is unchanged after the refused start" ||
    check_fail "the refused start changed the COW file"

# Exactly what is used is enough (the store is then full).
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" cow-size=$used control="$ctlsock"
export_equals "$(uri "$sock" snapshot)" "$orig" "cow-size=$used (what is used) reopens the snapshot intact"
ctl "$ctlsock" --json status snapshot || true
st=$(jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["state"]')
[ "$st" = valid ] && info "ok: reopened with cow-size=$used, state valid" ||
    check_fail "reopened with cow-size=$used, state '$st'"
stop_nbdkit "$pid"
sum=$(checksum "$cow")

# --- snapshot=NAME:COW at start-up ----------------------------------------
err="$tmpdir/start2.err"
if try_start_failure "$err" origin="$origin" snapshot="s:$cow" cow-size=$small; then
    info "ok: snapshot=s:COW with cow-size=$small refused: $(grep -m1 cow-size "$err" || head -n1 "$err")"
    try_stderr "$err" "$cow" "$small" "$used"
fi
[ "$(checksum "$cow")" = "$sum" ] && info "ok: the COW file is unchanged after the refused start" ||
    check_fail "the refused start (snapshot=) changed the COW file"
start_snapfg "$sock" "$pid" origin="$origin" snapshot="s:$cow" control="$ctlsock"
export_equals "$(uri "$sock" s)" "$orig" "snapshot=s:COW without cow-size= reopens the snapshot intact"
stop_nbdkit "$pid"

finish
