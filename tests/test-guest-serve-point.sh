#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A backed-up point served to a QEMU guest (issue 31): an ext4 disk with
# known files is backed up into a repository (snapfg-backup backup),
# the disk is then changed and the server stopped, and the point is
# served (snapfg-backup serve REPO --disk vda -U SOCK, read-only) as the
# guest's virtio disk through QEMU's own NBD client
# (-drive file=nbd:unix:SOCK, tests/guest/guest-lib.sh).  In the guest
# the kernel mounts it read-only and every file reads back with the md5
# it had at the backup, not the one it has since; a write to the disk
# is refused (the export is read-only).  Afterwards the served point
# equals its restore (qemu-img compare).  Skipped without qemu.
set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
source "$(dirname "$0")/guest/guest-lib.sh"
require_backup_tools
requires mkfs.ext4 qemu-img md5sum
guest_require
[ -n "${SNAPFG_REPO_PLUGIN:-}" ] && [ -f "$SNAPFG_REPO_PLUGIN" ] ||
    skip "the snapfg-repo plugin is not built"

# The file system and what the guest must find in it.
fsdir="$tmpdir/fs"
mkdir -p "$fsdir/etc" "$fsdir/data/deep"
echo "a point served to a guest" >"$fsdir/hello.txt"
head -c $((100 * 1024)) /dev/urandom >"$fsdir/etc/blob.bin"
head -c $((3 * 1024 * 1024 + 123)) /dev/urandom >"$fsdir/data/deep/big.bin"
img="$tmpdir/disk.img"
mkfs.ext4 -q -F -d "$fsdir" "$img" 64M
files=(hello.txt etc/blob.bin data/deep/big.bin)
for f in "${files[@]}"; do
    v=$(echo "$f" | tr '/.' '__')
    guest_set "MD5_$v" "$(md5sum <"$fsdir/$f" | cut -d' ' -f1)"
done
guest_set FILES "${files[*]}"

# Backed up, then changed on the live disk (the guest must see the point).
start_snapfg "$tmpdir/sock" "$tmpdir/nbdkit.pid" origin="$img" \
    state="$tmpdir/disk.state" control="$tmpdir/ctl"
require_checkpoints "$tmpdir/ctl"
repo="$tmpdir/repo"
bk init "$repo" || { cat "$tmpdir/bk.log"; fail "init failed"; }
bk backup "$repo" --disk vda -S "$tmpdir/ctl" -u "$(uri "$tmpdir/sock")" ||
    { cat "$tmpdir/bk.log"; fail "the backup failed"; }
stop_nbdkit "$tmpdir/nbdkit.pid"
"$PY" - "$img" <<'PYEOF'
import sys
# Overwrite the whole disk after its first MiB: every file's blocks.
with open(sys.argv[1], "r+b") as f:
    f.seek(1 << 20)
    f.write(b"\xa5" * ((64 << 20) - (1 << 20)))
PYEOF
bk restore "$repo" "$tmpdir/restored.img" --disk vda ||
    { cat "$tmpdir/bk.log"; fail "the restore failed"; }

# Served, read-only, to the guest.
ssock="$tmpdir/point.sock"
"$SNAPFG_BACKUP" serve "$repo" --disk vda -U "$ssock" 2>"$tmpdir/serve.log" &
spid=$!
_nbdkit_pids["$tmpdir/serve.pid"]=$spid
_nbdkit_logs["$tmpdir/serve.pid"]="$tmpdir/serve.log"
echo "$spid" >"$tmpdir/serve.pid"
wait_until 30 test -S "$ssock" ||
    { cat "$tmpdir/serve.log" >&2; fail "serve: no socket $ssock"; }
guest_nbd_disk point "$ssock" "" ro

cat >"$tmpdir/guest.sh" <<'GUEST'
# --- runs in the guest (busybox sh), sourced by /init ---
d=$(disk_by_serial point) || { fail "no virtio disk with serial point"; return 0; }
say "the served point is $d, $(blockdev --getsize64 "$d") bytes, read-only=$(blockdev --getro "$d")"
mkdir -p /mnt
if mount -t ext4 -o ro "$d" /mnt 2>/tmp/mount.err; then
    say "mounted $d read-only"
    for f in $FILES; do
        v=$(echo "$f" | tr '/.' '__')
        eval want=\$MD5_$v
        if [ -f "/mnt/$f" ]; then
            expect_md5 "$f as it was at the backup" "$(md5_file "/mnt/$f")" "$want"
        else
            fail "$f is not in the served file system"
        fi
    done
    val files_read "$(ls -R /mnt | wc -l)"
    umount /mnt
else
    fail "mount -t ext4 -o ro $d: $(cat /tmp/mount.err)"
fi
if dd if=/dev/zero of="$d" bs=4096 count=1 oflag=direct 2>/dev/null; then
    fail "a write to the read-only served point succeeded"
else
    say "a write to the served point is refused"
fi
GUEST

guest_run "$tmpdir/guest.sh" || true
[ -n "$(guest_val files_read)" ] && info "ok: the guest mounted the served point and read its files" ||
    check_fail "the guest did not read the served point's files"

qemu-img compare -f raw -F raw "$(uri "$ssock")" "$tmpdir/restored.img" &&
    info "ok: the served point = its restore" ||
    check_fail "the served point differs from its restore"
cmp -s "$tmpdir/restored.img" "$img" &&
    check_fail "the restore equals the changed disk: the test would prove nothing"
kill -TERM "$spid" 2>/dev/null || true
wait "$spid" 2>/dev/null || true
unset "_nbdkit_pids[$tmpdir/serve.pid]"
finish
