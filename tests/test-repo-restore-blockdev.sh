#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup restore of a repository point to a block device (a loop
# device over a file the test fills with junk first): every chunk is
# written, zero chunks too (a device is not a new file: its old data
# must not show through), and the device then holds the point byte for
# byte.  A device smaller than the disk is refused and left as it was.
# Skipped (77) where loop devices cannot be set up (not root, no
# loop module, a container without /dev/loop*).

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
require_backup_tools
requires losetup

MIB=$((1024 * 1024))
# A zero region the point must write over the device's junk.
zero_8m_at_4m() {
    dd if=/dev/zero of="$1" bs=1M seek=4 count=8 conv=notrunc status=none
}
repo_server a $((24 * MIB)) zero_8m_at_4m
repo=$(repo_loc blockdev)

# loop_setup VAR FILE: a loop device on FILE, its name in VAR, detached
# when the test exits (or skip).  Not called in $(...): the exit handler
# must be registered in this shell, not in a subshell that ends at once
# (it was, and every run left its loop device attached).
loop_setup() {
    local _loop
    _loop=$(losetup --find --show "$2" 2>"$tmpdir/losetup.err") ||
        skip "no loop device: $(cat "$tmpdir/losetup.err")"
    on_exit "losetup -d $_loop 2>/dev/null || true"
    printf -v "$1" '%s' "$_loop"
}

rb init "$repo" || fail "init: $(cat "$tmpdir/rb.log")"
rb_run "$repo" d a 1
write_random_blocks "$origin_a" 40 1 "$size"
rb_run "$repo" d a 2

# The backing file of the device: junk everywhere, so that a chunk the
# restore skipped shows.
head -c $((24 * MIB)) /dev/urandom >"$tmpdir/dev.img"
loop_setup dev "$tmpdir/dev.img"
for n in 1 2; do
    if rb restore "$repo" "$dev" --disk d --at "$n"; then
        if cmp "$dev" "$tmpdir/expect-d-$n.img"; then
            info "ok: run $n restored to $dev byte for byte"
        else
            check_fail "run $n restored to $dev differs: $(cmp "$dev" "$tmpdir/expect-d-$n.img" 2>&1 | head -n 1)"
        fi
    else
        check_fail "restore of run $n to $dev: $(cat "$tmpdir/rb.log")"
    fi
done

# A device smaller than the disk: refused, untouched.
head -c $((8 * MIB)) /dev/urandom >"$tmpdir/small.img"
cp "$tmpdir/small.img" "$tmpdir/small.orig"
loop_setup small "$tmpdir/small.img"
st=0; rb restore "$repo" "$small" --disk d || st=$?
[ "$st" -ne 0 ] && grep -q "smaller than the disk" "$tmpdir/rb.log" &&
    info "ok: a device smaller than the disk is refused" ||
    check_fail "restore to a small device: exit $st: $(cat "$tmpdir/rb.log")"
losetup -d "$small"
cmp "$tmpdir/small.img" "$tmpdir/small.orig" ||
    check_fail "a refused restore changed the small device"

finish
