#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Snapshot semantics under random I/O (nbd-check semantics) for several
# chunk sizes, block sizes and both locking modes: the origin returns
# the latest data, the snapshot the data at start plus its own writes;
# trim/zero/fast zero, flush/FUA, block sizes, extents.  After nbdkit
# exits the origin file must equal the driver's model and the transient
# COW file must be empty; a restart reuses that COW file.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg
require_nbd_check
requires nbdcopy

test_files

# run_case NAME SIZE SEED "DRIVER OPTIONS" PLUGIN-PARAMS...
run_case() {
    local name=$1 size=$2 seed=$3 dopts=$4 t0=$SECONDS
    shift 4
    info "=== $name: size $size, plugin params: $*"
    make_random_image "$origin" "$size"
    # A hole in the part of the origin random I/O leaves alone: the
    # snapshot's extents there must match the origin's.
    if have fallocate; then
        fallocate --punch-hole --offset $((size * 3 / 4 / 65536 * 65536)) \
            --length 262144 "$origin" 2>/dev/null || true
    fi
    cp "$origin" "$orig"
    rm -f "$cow" "$expected"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" store=transient "$@"
    # shellcheck disable=SC2086
    "$NBD_CHECK" semantics $dopts --expect-origin "$expected" \
        "$(uri "$sock" origin)" "$(uri "$sock" snapshot)" "$orig" "$seed" ||
        fail "$name: nbd-check semantics failed (seed $seed)"
    stop_nbdkit "$pid"
    cmp "$origin" "$expected" ||
        fail "$name: origin file after exit differs from the expected contents"
    [ "$(file_size "$cow")" -eq 0 ] ||
        fail "$name: transient COW file is $(file_size "$cow") bytes after a clean exit, expected 0"
    info "$name: passed in $((SECONDS - t0)) s"
}

test_seed

# Sizes are multiples of the block size but not of the chunk size, so
# the last chunk is partial.
run_case "4K chunks, 512 blocks, striped" $((8 * 1024 * 1024 + 2560)) "$seed" \
    "--chunk 4096 --min 512 --pref 4096" \
    chunk-size=4K locking=striped

run_case "64K chunks, 512 blocks, global" $((8 * 1024 * 1024 + 4608)) $((seed + 1)) \
    "--chunk 65536 --min 512 --pref 65536 --ops 800" \
    chunk-size=64K block-size=512 locking=global

run_case "4K chunks, 4096 blocks, striped, aligned I/O" $((8 * 1024 * 1024 + 12288)) $((seed + 2)) \
    "--chunk 4096 --min 4096 --pref 4096 --aligned" \
    chunk-size=4K block-size=4096 locking=striped

# Chunks smaller than the block size: every request covers 8 chunks.
run_case "512 B chunks, 4096 blocks, global, aligned I/O" $((4 * 1024 * 1024 + 4096)) $((seed + 3)) \
    "--chunk 512 --min 4096 --pref 4096 --aligned --ops 800" \
    chunk-size=512 block-size=4096 locking=global

# Largest chunk: a few big copy-outs.
run_case "1M chunks, 512 blocks, striped" $((16 * 1024 * 1024)) $((seed + 4)) \
    "--chunk 1048576 --min 512 --pref 1048576 --ops 200" \
    chunk-size=1M locking=striped

# The COW file left by the last run (truncated to 0) is reused by a new
# start, which takes a new snapshot of the current origin.
[ "$(file_size "$cow")" -eq 0 ] || fail "COW file not empty before restart"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" store=transient chunk-size=4K
export_equals "$(uri "$sock" snapshot)" "$expected" \
    "after a restart, the snapshot (must equal the current origin)"
fill_export "$(uri "$sock" origin)" 4096 8192 0x77
export_equals "$(uri "$sock" snapshot)" "$expected" \
    "after a restart and an origin write, the snapshot"
stop_nbdkit "$pid"
[ "$(file_size "$cow")" -eq 0 ] || fail "COW file not truncated after the restart"
info "restart reusing the truncated COW file: ok"

finish
