#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# QEMU's NBD client against snapfg: the guest's virtio disks are snapfg
# exports attached by QEMU (-drive file=nbd:unix:SOCK:exportname=...,
# cache=none, discard=unmap), in a guest VM (tests/guest/guest-lib.sh;
# skipped without qemu).
#   /dev/vda  "origin"    read-write
#   /dev/vdb  "snapshot"  read-only
#   /dev/vdc  ""          (the default export, the origin) read-only
# The guest checks that all three read the original image (md5 from the
# host); writes with dd oflag=direct (sub-chunk and unaligned, and 1 MiB
# over many chunks), discards a range (blkdiscard: NBD_CMD_TRIM), zeroes
# a range (blkdiscard -z: NBD_CMD_WRITE_ZEROES), syncs and fsyncs
# (NBD_CMD_FLUSH); the data reads back, vdb still reads the original
# image, and vdc reads what vda now holds.
# After the guest: the origin file equals the expected bytes (original +
# writes + zeroes; the discarded range zero, or unchanged if trim was
# ignored), the guest's last view of vda equals the file, and the
# snapshot export (nbdcopy) equals the original image.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/guest/guest-lib.sh"
require_snapfg
requires nbdcopy cmp md5sum
guest_require

MIB=1048576
KIB=1024
size=$((8 * MIB))
make_random_image "$tmpdir/orig.img" "$size"
cp "$tmpdir/orig.img" "$tmpdir/origin.img"
make_random_image "$tmpdir/w1" $((8 * KIB + 512))   # at 1 MiB + 1536
make_random_image "$tmpdir/w2" "$MIB"               # at 3 MiB
guest_file "$tmpdir/w1" w1
guest_file "$tmpdir/w2" w2
guest_set ORIG_MD5 "$(md5_of "$tmpdir/orig.img")"
for f in expect expect-keep; do
    cp "$tmpdir/orig.img" "$tmpdir/$f.img"
    patch_file "$tmpdir/$f.img" $((MIB + 1536)) "$tmpdir/w1"
    patch_file "$tmpdir/$f.img" $((3 * MIB)) "$tmpdir/w2"
    zero_file "$tmpdir/$f.img" $((6 * MIB + 512)) $((64 * KIB))    # blkdiscard -z
done
zero_file "$tmpdir/expect.img" $((5 * MIB)) $((256 * KIB))        # blkdiscard

start_snapfg "$tmpdir/sock" "$tmpdir/pid" origin="$tmpdir/origin.img" cow="$tmpdir/cow.img" \
    store=persistent chunk-size=4K
guest_nbd_disk origin "$tmpdir/sock" origin
guest_nbd_disk snapshot "$tmpdir/sock" snapshot ro
guest_nbd_disk default "$tmpdir/sock" "" ro

cat >"$tmpdir/guest.sh" <<'GUEST'
# --- runs in the guest (busybox sh), sourced by /init ---
KIB=1024
for s in origin snapshot default; do
    d=$(disk_by_serial "$s") || { fail "no virtio disk with serial $s"; continue; }
    eval "dev_$s=$d"
    sz=$(blockdev --getsize64 "$d")
    [ "$sz" = $((8 * MIB)) ] && say "$s export is $d, $sz bytes, read-only=$(blockdev --getro "$d")" ||
        fail "$s export $d: size $sz, expected $((8 * MIB))"
done
o=$dev_origin
expect_md5 "origin disk reads the original image" "$(md5_dev "$o")" "$ORIG_MD5"
expect_md5 "snapshot disk reads the original image" "$(md5_dev "$dev_snapshot")" "$ORIG_MD5"
expect_md5 "default-export disk reads the original image" "$(md5_dev "$dev_default")" "$ORIG_MD5"
step "writes"
write_at "$o" /data/w1 512 $(((MIB + 1536) / 512))
write_at "$o" /data/w2 65536 $((3 * MIB / 65536))
step "discard"
if blkdiscard -o $((5 * MIB)) -l $((256 * KIB)) "$o"; then say "blkdiscard $((5 * MIB))+$((256 * KIB))"
else fail "blkdiscard -o $((5 * MIB)) -l $((256 * KIB)) $o failed (discard_max_bytes $(cat /sys/block/${o##*/}/queue/discard_max_bytes))"; fi
step "write zeroes"
if blkdiscard -z -o $((6 * MIB + 512)) -l $((64 * KIB)) "$o"; then say "blkdiscard -z $((6 * MIB + 512))+$((64 * KIB))"
else fail "blkdiscard -z -o $((6 * MIB + 512)) -l $((64 * KIB)) $o failed"; fi
step "sync"
sync
sync "$o" || fail "fsync $o failed"
echo 3 >/proc/sys/vm/drop_caches
expect_md5 "W1 reads back" "$(md5_dev "$o" 512 17 $(((MIB + 1536) / 512)))" "$(md5_file /data/w1)"
expect_md5 "W2 reads back" "$(md5_dev "$o" 65536 16 48)" "$(md5_file /data/w2)"
z=$(head -c $((64 * KIB)) /dev/zero | md5sum | cut -d' ' -f1)
expect_md5 "the zeroed range reads zeroes" "$(md5_dev "$o" 512 128 $(((6 * MIB + 512) / 512)))" "$z"
expect_md5 "snapshot disk still reads the original image" "$(md5_dev "$dev_snapshot")" "$ORIG_MD5"
om=$(md5_dev "$o")
val origin_md5 "$om"
expect_md5 "default-export disk reads what the origin disk holds" "$(md5_dev "$dev_default")" "$om"
GUEST

guest_run "$tmpdir/guest.sh" || true

# --- host checks after the guest ---------------------------------------
if cmp -s "$tmpdir/origin.img" "$tmpdir/expect.img"; then
    info "ok: origin file = original + the guest's writes and zeroes, discarded range zero"
elif cmp -s "$tmpdir/origin.img" "$tmpdir/expect-keep.img"; then
    info "ok: origin file = original + the guest's writes and zeroes (the discard left the data: trim is advisory)"
else
    check_fail "origin file differs from the expected bytes: $(cmp "$tmpdir/origin.img" "$tmpdir/expect.img" 2>&1 | head -c 200)"
fi
check_md5 "the guest's last view of the origin disk = origin file" "$(guest_val origin_md5)" "$(md5_of "$tmpdir/origin.img")"
check_export "$(uri "$tmpdir/sock" snapshot)" "$tmpdir/orig.img" "snapshot export (nbdcopy) = original image"
check_export "$(uri "$tmpdir/sock" origin)" "$tmpdir/origin.img" "origin export (nbdcopy) = origin file"
stop_nbdkit "$tmpdir/pid"
finish
