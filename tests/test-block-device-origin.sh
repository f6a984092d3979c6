#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A block device as the origin (two loop devices over files of the same
# size and contents in the test's directory; skipped if loop devices
# cannot be set up, e.g. when not run as root), with a persistent store:
#  1. origin writes copy out; the snapshot reads as the original;
#  2. a restart naming the origin through another device node (same
#     device number, another path) reopens the store: the binding record
#     knows a block device by its device number;
#  3. a restart on the other loop device (same size, same original data)
#     is refused ("belongs to another origin") and the store is left
#     byte for byte unchanged.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg
requires losetup nbdcopy cmp mknod stat

size=$((4 * 1024 * 1024))
cow="$tmpdir/store.cow"
sock="$tmpdir/sock"
pid="$tmpdir/nbdkit.pid"
err="$tmpdir/err"

make_random_image "$tmpdir/a.img" "$size"
cp "$tmpdir/a.img" "$tmpdir/b.img"
cp "$tmpdir/a.img" "$tmpdir/original.img"
devs=()
for f in a b; do
    d=$(losetup -f --show "$tmpdir/$f.img" 2>"$tmpdir/losetup.err") ||
        skip "loop devices are unavailable ($(head -c 200 "$tmpdir/losetup.err"); run as root with loop support)"
    on_exit "losetup -d '$d'"
    devs+=("$d")
done
info "origin $(basename "${devs[0]}"), the other device $(basename "${devs[1]}")"

# --- 1. a block device origin with a persistent store ---
start_snapfg "$sock" "$pid" origin="${devs[0]}" cow="$cow" store=persistent
fill_export "$(uri "$sock")" 0 65536 0x5a
export_equals "$(uri "$sock" snapshot)" "$tmpdir/original.img" "snapshot of ${devs[0]}"
stop_nbdkit "$pid"
info "ok: the snapshot of the block device origin reads as the original"

# --- 2. the same device through another node ---
alias="$tmpdir/origin-node"
if mknod "$alias" b $((0x$(stat -c %t "${devs[0]}"))) \
       $((0x$(stat -c %T "${devs[0]}"))) 2>"$tmpdir/mknod.err"; then
    start_snapfg "$sock" "$pid" origin="$alias" cow="$cow" store=persistent
    export_equals "$(uri "$sock" snapshot)" "$tmpdir/original.img" \
        "snapshot reopened through $(basename "$alias")"
    stop_nbdkit "$pid"
    info "ok: the store was reopened through another node for the same device"
else
    info "cannot make a device node in $tmpdir ($(head -c 200 "$tmpdir/mknod.err")): part 2 not run"
fi

# --- 3. another device of the same size is not the origin ---
before=$(checksum "$cow")
expect_start_failure "$err" origin="${devs[1]}" cow="$cow" store=persistent
expect_stderr "$err" "cow=$cow" "belongs to another origin"
[ "$(checksum "$cow")" = "$before" ] || fail "the refused store was written to"
info "ok: another block device of the same size is refused; the store is unchanged"

finish
