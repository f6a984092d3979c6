#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Real clients on a busy origin: fio with verify=crc32c writes the
# origin through fio's nbd engine while nbdcopy and qemu-img convert copy
# the snapshot (both copies must equal the image as it was), and
# nbdinfo --map reports the snapshot's allocation (data where the image
# had data, holes where it had holes, also after the origin overwrote
# them).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit nbdinfo nbdcopy fio
require_snapfg

size=$((64 * 1024 * 1024))
half=$((size / 2))
origin=$tmpdir/origin.img
pristine=$tmpdir/pristine.img
cow=$tmpdir/origin.cow
sock=$tmpdir/sock
pid=$tmpdir/pid

# First half random data, second half a hole.
truncate -s "$size" "$origin"
head -c "$half" /dev/urandom | dd of="$origin" conv=notrunc status=none
cp --sparse=always "$origin" "$pristine"

start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
o_uri=$(uri "$sock" origin)
s_uri=$(uri "$sock" snapshot)

# --- nbdinfo --map before any write ---------------------------------
# map_check EXPORT-URI LABEL: nbdinfo --map covers the export exactly
# and reports no hole in the first (data) half; sets map_holes to the
# bytes it reports as holes in the second half.  Not run in $(...): its
# check_fail must count in this shell.
map_holes=
map_check() {
    local u=$1 label=$2 total
    nbdinfo --map "$u" >"$tmpdir/map.txt"
    total=$(awk '{ s += $2 } END { print s }' "$tmpdir/map.txt")
    [ "$total" -eq "$size" ] ||
        check_fail "$label: nbdinfo --map covers $total bytes, not $size"
    # Nothing in the first (data) half may be reported as a hole/zero.
    if awk -v h="$half" '$1 < h && $3 != 0 { bad = 1 } END { exit !bad }' \
           "$tmpdir/map.txt"; then
        check_fail "$label: data reported as a hole in the first half: $(cat "$tmpdir/map.txt")"
    fi
    # What the map reports as hole and zero (type 3) in the second half.
    map_holes=$(awk -v h="$half" '$1 >= h && $3 == 3 { s += $2 } END { print s + 0 }' \
                    "$tmpdir/map.txt")
}
map_check "$s_uri" "snapshot before writes"
holes=$map_holes
[ "$holes" -eq "$half" ] ||
    check_fail "snapshot map before writes: $holes bytes of holes in the second half, expected $half"
info "nbdinfo --map of the snapshot: data half, hole half"

# --- fio verify=crc32c on the origin while the snapshot is copied -----
# Two jobs, each in its own region spanning both halves' boundary area.
fio --name=verify --ioengine=nbd --uri="$o_uri" --rw=randwrite --bs=4k \
    --iodepth=8 --numjobs=2 --size=16M --offset=24M --offset_increment=16M \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --randrepeat=0 --output-format=json \
    --output="$tmpdir/fio.out" >/dev/null 2>&1 &
fio_pid=$!
rm -f "$tmpdir/copy1.img" "$tmpdir/copy2.img"
nbdcopy "$s_uri" "$tmpdir/copy1.img"
if have qemu-img; then
    qemu-img convert -f raw -O raw "$s_uri" "$tmpdir/copy2.img"
fi
st=0; wait "$fio_pid" || st=$?
[ "$st" -eq 0 ] || { cat "$tmpdir/fio.out" >&2; fail "fio verify=crc32c on the origin failed (status $st)"; }
# fio's exit status alone does not show that it verified anything: each
# job must have read back (the verify pass) all it wrote, without error.
"$PY" - "$tmpdir/fio.out" <<'EOF' ||
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
want = 16 * 1024 * 1024
if len(jobs) != 2:
    sys.exit("fio reported %d jobs, expected 2" % len(jobs))
for j in jobs:
    w, r = j["write"]["io_bytes"], j["read"]["io_bytes"]
    if j["error"] != 0 or w != want or r != w:
        sys.exit("fio job %s: error %d, wrote %d bytes, read back %d "
                 "(expected %d and %d)" % (j["jobname"], j["error"], w, r,
                                           want, want))
EOF
    { cat "$tmpdir/fio.out" >&2; fail "fio did not write and read back (verify) all it should have"; }
info "fio wrote and verified (crc32c) 32 MiB of the origin through the nbd engine"

cmp "$tmpdir/copy1.img" "$pristine" ||
    check_fail "nbdcopy of the snapshot taken while fio wrote the origin differs from the image"
if [ -f "$tmpdir/copy2.img" ]; then
    cmp "$tmpdir/copy2.img" "$pristine" ||
        check_fail "qemu-img convert of the snapshot taken while fio wrote the origin differs from the image"
fi
if [ -f "$tmpdir/copy2.img" ]; then
    info "nbdcopy and qemu-img convert of the snapshot equal the image while the origin was written"
else
    info "nbdcopy of the snapshot equals the image while the origin was written"
    skip_part "qemu-img convert of the snapshot while the origin was written: qemu-img is not installed"
fi

# --- after the writes: maps and contents -------------------------------
nbdcopy "$s_uri" "$tmpdir/copy3.img"
cmp "$tmpdir/copy3.img" "$pristine" ||
    check_fail "the snapshot differs from the image after fio"
map_check "$s_uri" "snapshot after writes"
holes=$map_holes
# Copied chunks of the hole half are data now (a copy of zeroes); the
# rest of that half is still a hole, and all of it reads as zero
# (checked by cmp above).
[ "$holes" -lt "$half" ] ||
    check_fail "snapshot map after writes still reports the whole second half as a hole (copied chunks must be data)"
map_check "$o_uri" "origin after writes"
o_holes=$map_holes
[ "$o_holes" -lt "$half" ] ||
    check_fail "origin map after writes still reports the whole second half as a hole"
info "nbdinfo --map after the writes: snapshot $holes, origin $o_holes bytes of holes in the second half"

stop_nbdkit "$pid"
finish
