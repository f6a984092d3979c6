#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A transient COW store on a block device (a loop device over a file in
# the test's directory; skipped if loop devices cannot be set up, e.g.
# when not run as root).
#  1. Origin writes copy the original data into the block device (read
#     back from the device itself while the server runs); the snapshot
#     reads as the original.
#  2. A clean exit zeroes what the store used: the whole device reads as
#     zero afterwards (a block device cannot be truncated like a file).
#  3. So the next start accepts the device, and its new snapshot works.
#  4. A block device holding foreign data is refused, naming cow= and
#     the device, and is left byte for byte unchanged.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg
requires losetup nbdcopy cmp truncate
"$PY" -c 'import nbd' 2>/dev/null || skip "$PY with the libnbd 'nbd' module is needed"

size=$((4 * 1024 * 1024))
written=$((1024 * 1024))            # origin bytes overwritten in step 1
cow_size=$((8 * 1024 * 1024))
test_files
original="$tmpdir/original.img"
backing="$tmpdir/cow-backing.img"
err="$tmpdir/err"

truncate -s "$cow_size" "$backing"
loop=$(losetup -f --show "$backing" 2>"$tmpdir/losetup.err") || loop=
[ -n "$loop" ] && [ -b "$loop" ] ||
    skip "loop devices are unavailable ($(head -c 200 "$tmpdir/losetup.err"); run as root with loop support)"
# Detach even if the test fails (the EXIT trap runs this before the
# temporary directory holding the backing file is removed).
on_exit "losetup -d '$loop'"
info "COW store on $loop (backed by $(basename "$backing"), $cow_size bytes)"

make_random_image "$origin" "$size"
cp "$origin" "$original"

# device_is_zero: the whole loop device reads as zero.
device_is_zero() { cmp -s -n "$cow_size" "$loop" /dev/zero; }
device_is_zero || fail "precondition: the new loop device is not all zero"

# --- 1. copy-outs go into the block device ---
start_snapfg "$sock" "$pid" origin="$origin" cow="$loop" store=transient \
    chunk-size=64K
fill_export "$(uri "$sock")" 0 "$written" 0x5a
# The transient store hands out chunks from 0 upwards: the first
# $written bytes of the device now hold the origin's original data.
cmp -n "$written" "$loop" "$original" >/dev/null 2>&1 ||
    fail "the block device does not hold the original data of the overwritten chunks"
export_equals "$(uri "$sock" snapshot)" "$original" "snapshot (block device COW)"
info "ok: copy-outs went into $loop; the snapshot reads as the original"

# --- 2. a clean exit zeroes what was used ---
stop_nbdkit "$pid"
device_is_zero ||
    fail "after a clean exit the block device still holds data: $(cmp "$loop" /dev/zero 2>&1 | head -c 200)"
info "ok: the clean exit zeroed the used region of $loop"

# --- 3. the next start accepts the device ---
cp "$origin" "$original"            # the new snapshot's original
start_snapfg "$sock" "$pid" origin="$origin" cow="$loop" store=transient \
    chunk-size=64K
fill_export "$(uri "$sock")" $((2 * 1024 * 1024)) 65536 0xa5
export_equals "$(uri "$sock" snapshot)" "$original" "snapshot after the restart"
stop_nbdkit "$pid"
device_is_zero || fail "after the second clean exit the block device still holds data"
info "ok: the next start accepted the zeroed device; zeroed again on exit"

# --- 4. foreign data is refused and left alone ---
head -c 65536 /dev/urandom >"$tmpdir/foreign"
dd if="$tmpdir/foreign" of="$loop" bs=65536 seek=40 conv=fsync status=none
before=$(checksum "$loop")
expect_start_failure "$err" origin="$origin" cow="$loop" store=transient
expect_stderr "$err" "cow=$loop" "holds data"
[ "$(checksum "$loop")" = "$before" ] ||
    fail "the refused block device was written to"
info "ok: a block device holding data is refused and unchanged"

finish
