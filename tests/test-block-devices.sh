#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Block devices as origin and as persistent COW store (loop devices over
# files in the test's directory; skipped if loop devices cannot be set
# up, e.g. when not run as root).  The transient store on a block device
# is test-transient-block-device.sh.
# A block device origin (two loop devices over files of the same size
# and contents), with a persistent store in a file:
#  1. origin writes copy out; the snapshot reads as the original;
#  2. a restart naming the origin through another device node (same
#     device number, another path) reopens the store: the binding record
#     knows a block device by its device number;
#  3. a restart on the other loop device (same size, same original data)
#     is refused ("belongs to another origin") and the store is left
#     byte for byte unchanged.
# A persistent store on a block device (a third, all-zero loop device):
#  4. accepted as a new store; origin writes copy out into it; after a
#     restart it reopens with the snapshot intact (read back byte for
#     byte), and snapfgctl inspect reads it on the device.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg
requires losetup nbdcopy cmp mknod stat truncate

size=$((4 * 1024 * 1024))
test_files
cow="$tmpdir/store.cow"
err="$tmpdir/err"

make_random_image "$tmpdir/a.img" "$size"
cp "$tmpdir/a.img" "$tmpdir/b.img"
cp "$tmpdir/a.img" "$tmpdir/original.img"
truncate -s $((2 * size)) "$tmpdir/c.img"
devs=()
for f in a b c; do
    d=$(losetup -f --show "$tmpdir/$f.img" 2>"$tmpdir/losetup.err") ||
        skip "loop devices are unavailable ($(head -c 200 "$tmpdir/losetup.err"); run as root with loop support)"
    on_exit "losetup -d '$d'"
    devs+=("$d")
done
info "origin $(basename "${devs[0]}"), the other device $(basename "${devs[1]}"), store $(basename "${devs[2]}")"

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
    skip_part "2, the same device through another node: cannot make a device node in $tmpdir ($(head -c 200 "$tmpdir/mknod.err"))"
fi

# --- 3. another device of the same size is not the origin ---
before=$(checksum "$cow")
expect_start_failure "$err" origin="${devs[1]}" cow="$cow" store=persistent
expect_stderr "$err" "cow=$cow" "belongs to another origin"
[ "$(checksum "$cow")" = "$before" ] || fail "the refused store was written to"
info "ok: another block device of the same size is refused; the store is unchanged"

# --- 4. a persistent store on a block device ---
origin="$tmpdir/origin.img"
make_random_image "$origin" "$size"
cp "$origin" "$tmpdir/original.img"
start_snapfg "$sock" "$pid" origin="$origin" cow="${devs[2]}" store=persistent
fill_export "$(uri "$sock")" 65536 $((512 * 1024)) 0xa5
export_equals "$(uri "$sock" snapshot)" "$tmpdir/original.img" "snapshot in ${devs[2]}"
stop_nbdkit "$pid"
start_snapfg "$sock" "$pid" origin="$origin" cow="${devs[2]}" store=persistent
export_equals "$(uri "$sock" snapshot)" "$tmpdir/original.img" \
    "snapshot reopened from ${devs[2]}"
stop_nbdkit "$pid"
if [ -n "${SNAPFGCTL:-}" ] && [ -x "$SNAPFGCTL" ]; then
    "$SNAPFGCTL" inspect "${devs[2]}" >"$tmpdir/inspect.out" 2>&1 ||
        fail "snapfgctl inspect ${devs[2]}: $(head -c 300 "$tmpdir/inspect.out")"
    grep -q '^valid: 1' "$tmpdir/inspect.out" ||
        fail "snapfgctl inspect ${devs[2]}: not a valid store: $(head -c 300 "$tmpdir/inspect.out")"
fi
info "ok: a persistent store on ${devs[2]} keeps the snapshot across a restart"

finish
