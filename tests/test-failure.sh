#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A full COW store (cow-size= of 16 chunks):
#  - origin writes needing copy-outs beyond it make the snapshot Invalid:
#    the origin writes succeed and hold the right data, every request on
#    the snapshot fails with EIO, the status says Invalid;
#  - snapshot writes needing a new chunk beyond it fail with ENOSPC, the
#    snapshot stays valid and readable, the status says Overflow;
#  - after Overflow, an origin write needing a copy-out invalidates.
# The COW file never grows past cow-size, and is truncated on exit.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg
require_nbd_check
requires nbdinfo nbdcopy

size=$((4 * 1024 * 1024))
chunk=4096
cow_chunks=16
cow_size=$((cow_chunks * chunk))
test_files

# snapshot_description: the description nbdinfo --list gives the snapshot.
snapshot_description() { export_description "$sock" snapshot; }

# run_mode MODE WORD [PARAMS...]
run_mode() {
    local mode=$1 word=$2 desc t0=$SECONDS
    shift 2
    info "=== $mode"
    make_random_image "$origin" "$size"
    cp "$origin" "$orig"
    rm -f "$cow" "$expected"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" store=transient \
        chunk-size=$chunk cow-size=$cow_size "$@"
    "$NBD_CHECK" failure "$mode" --chunk $chunk --cow-chunks $cow_chunks \
        --expect-origin "$expected" \
        "$(uri "$sock" origin)" "$(uri "$sock" snapshot)" "$orig" ||
        check_fail "$mode: nbd-check failure $mode failed"
    desc=$(snapshot_description)
    info "$mode: snapshot description after the run: '$desc'"
    case $desc in
        *"$word"*) ;;
        *) fail "$mode: snapshot description '$desc' does not say $word" ;;
    esac
    [ "$(file_size "$cow")" -le "$cow_size" ] ||
        fail "$mode: COW file grew to $(file_size "$cow") bytes, past cow-size=$cow_size"
    stop_nbdkit "$pid"
    cmp "$origin" "$expected" || fail "$mode: origin file differs from the expected contents"
    [ "$(file_size "$cow")" -eq 0 ] || fail "$mode: transient COW file not truncated on exit"
    info "$mode: done in $((SECONDS - t0)) s"
}

run_mode invalid Invalid
run_mode overflow Overflow locking=global
run_mode overflow-invalid Invalid

# The Invalid snapshot stays Invalid while the origin keeps changing,
# and a restart (new transient snapshot) is valid again.
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" store=transient chunk-size=$chunk cow-size=$cow_size
export_equals "$(uri "$sock" snapshot)" "$origin" "new snapshot after restart"
desc=$(snapshot_description)
case $desc in
    *Invalid*|*Overflow*) fail "new snapshot after restart is '$desc'" ;;
esac
stop_nbdkit "$pid"
info "restart gives a valid snapshot: '$desc'"

finish
