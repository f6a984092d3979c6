#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# drop while the state file system is full (issue 19 row 2; a small
# tmpfs, skipped if this machine cannot mount one).  The catalogue and
# the state directory are on the tmpfs, which is then filled up:
#   - drop s1 fails (ENOSPC: the catalogue cannot be rewritten) and
#     changes nothing: s1 is still listed and served byte for byte, its
#     store in the state directory is still there, the catalogue still
#     lists it;
#   - a restart on the still-full file system works and brings s1 back;
#   - with room again, drop s1 succeeds and removes its store, and a
#     restart works without it.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
requires mount umount dd

MiB=$((1024 * 1024))
test_files $MiB
mnt="$tmpdir/mnt"
mkdir "$mnt"
mount -t tmpfs -o "size=$((1024 * 4096)),mode=0700" tmpfs "$mnt" 2>"$tmpdir/mount.err" ||
    skip "cannot mount a tmpfs: $(cat "$tmpdir/mount.err")"
on_exit 'umount -l "$mnt"'
state="$mnt/cat.json"
start() { rm -f "$ctlsock"; start_snapfg "$sock" "$pid" origin="$origin" state="$state" control="$ctlsock"; }
recorded() { jq_py "$state" '" ".join(s["name"] for s in d["snapshots"])'; }

start
cp "$origin" "$tmpdir/s1.expected"
ctl_ok "create s1 (store in the state directory)" "$ctlsock" create s1
cio writes "$(uri "$sock" origin)" --seed 1 --list "0:65536,$((512 * 1024)):8192" >/dev/null ||
    fail "origin write failed"
export_equals "$(uri "$sock" s1)" "$tmpdir/s1.expected" "s1 before the file system fills"

dd if=/dev/zero of="$mnt/filler" bs=4096 2>/dev/null || true
if dd if=/dev/zero of="$mnt/probe" bs=4096 count=1 2>/dev/null; then
    fail "the tmpfs is not full"
fi
rm -f "$mnt/probe"
info "the state file system is full: $(df -k "$mnt" | tail -n1); $(ls -ls "$state.d" | tr "\n" " ")"

ctl_refused "drop s1 on a full state file system" "nothing was changed" "$ctlsock" drop s1
grep -qiF "space" "$tmpdir/ctl.err" && info "ok: the error says there is no space" ||
    check_fail "the drop's error does not mention the lack of space: $(cat "$tmpdir/ctl.err")"
[ -f "$state.d/s1.cow" ] && info "ok: s1's store is still there" ||
    check_fail "s1's store $state.d/s1.cow was removed by a drop that failed"
[ "$(recorded)" = s1 ] && info "ok: the catalogue still lists s1" ||
    check_fail "the catalogue lists '$(recorded)', expected s1"
listed "$sock" s1 && info "ok: s1 is still exported" || check_fail "s1 is no longer exported"
export_equals "$(uri "$sock" s1)" "$tmpdir/s1.expected" "s1 after the failed drop"

stop_nbdkit "$pid"
start
export_equals "$(uri "$sock" s1)" "$tmpdir/s1.expected" "s1 after a restart on the full file system"

rm -f "$mnt/filler"
info "room again: $(df -k "$mnt" | tail -n1); $(ls -ls "$mnt" "$state.d" | tr "\n" " ")"
ctl_ok "drop s1 with room again" "$ctlsock" drop s1
[ ! -e "$state.d/s1.cow" ] && info "ok: the drop removed s1's store" ||
    check_fail "s1's store is left after the drop"
[ "$(recorded)" = "" ] || check_fail "the catalogue still lists '$(recorded)'"
stop_nbdkit "$pid"
start
listed "$sock" s1 && check_fail "s1 is back after its drop" || info "ok: a restart works, without s1"
stop_nbdkit "$pid"
finish
