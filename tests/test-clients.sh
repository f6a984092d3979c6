#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Real clients against snapfg: qemu-io writes the origin, qemu-img
# convert and nbdcopy read the snapshot back (it must equal the original
# image), qemu-img compare, parallel bulk writes with qemu-img convert
# and nbdcopy to both exports, nbdinfo --list.  Parts whose tool is
# missing are skipped; the test is skipped only if all of qemu-io,
# qemu-img and nbdcopy are missing.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg

if ! have qemu-io && ! have qemu-img && ! have nbdcopy; then
    skip "none of qemu-io, qemu-img, nbdcopy is installed"
fi
for t in qemu-io qemu-img nbdcopy nbdinfo; do
    have "$t" || skip_part "the $t part: $t is not installed"
done

size=$((8 * 1024 * 1024))
test_files "$size"
cp "$origin" "$expected"

start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" store=transient chunk-size=4K
o_uri=$(uri "$sock" origin)
s_uri=$(uri "$sock" snapshot)

# export_equals_all URI FILE LABEL: read the export with every tool
# present (qemu-img convert and compare, nbdcopy); with neither, with
# libnbd's Python binding, so that the export is always read and
# compared.
export_equals_all() {
    local u=$1 f=$2 label=$3 compared=0
    if have qemu-img; then
        rm -f "$tmpdir/out-qemu.img"
        qemu-img convert -f raw -O raw "$u" "$tmpdir/out-qemu.img"
        cmp "$tmpdir/out-qemu.img" "$f" ||
            fail "$label: qemu-img convert of $u differs from $(basename "$f")"
        qemu-img compare -f raw -F raw "$u" "$f" >/dev/null ||
            fail "$label: qemu-img compare: $u differs from $(basename "$f")"
        compared=1
    fi
    if have nbdcopy; then
        rm -f "$tmpdir/out-nbdcopy.img"
        nbdcopy "$u" "$tmpdir/out-nbdcopy.img"
        cmp "$tmpdir/out-nbdcopy.img" "$f" ||
            fail "$label: nbdcopy of $u differs from $(basename "$f")"
        compared=1
    fi
    if [ "$compared" -eq 0 ]; then
        "$PY" - "$u" "$f" <<'EOF' ||
import sys
import nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
want = open(sys.argv[2], "rb").read()
size = h.get_size()
if size != len(want):
    sys.exit("export size %d, file size %d" % (size, len(want)))
for off in range(0, size, 1 << 20):
    n = min(1 << 20, size - off)
    if h.pread(n, off) != want[off:off + n]:
        sys.exit("export differs in [%d, +%d)" % (off, n))
h.shutdown()
EOF
            fail "$label: $u read with $PY (nbd module) differs from $(basename "$f")"
    fi
}

# snapshot_equals FILE LABEL, origin_equals FILE LABEL
snapshot_equals() {
    export_equals_all "$s_uri" "$1" "$2"
    info "$2: snapshot equals $(basename "$1")"
}
origin_equals() {
    export_equals_all "$o_uri" "$1" "$2"
    info "$2: origin equals $(basename "$1")"
}

# --- 1. qemu-io writes to the origin --------------------------------
if have qemu-io; then
    cmds=(-c 'write -P 0xab 0 64k'
          -c 'write -P 0xcd 1M 4k'
          -c 'write -P 0x5a 2050k 3k'
          -c 'writev -P 0x11 3M 4k 8k'
          -c 'write -z 4M 64k'
          -c 'aio_write -P 0x22 5M 128k'
          # (concurrent writes must not overlap: their order is undefined)
          -c 'aio_write -P 0x33 5248k 128k'
          -c 'aio_flush'
          -c 'flush')
    qemu-io -f raw "$o_uri" "${cmds[@]}" >"$tmpdir/qemu-io.out" ||
        { cat "$tmpdir/qemu-io.out" >&2; fail "qemu-io writes to the origin failed"; }
    # The same commands on a local copy give the expected origin.
    qemu-io -f raw "$expected" "${cmds[@]}" >/dev/null
    # Read the data back through qemu-io (pattern checks fail the exit code).
    qemu-io -f raw "$o_uri" -c 'read -P 0xab 0 64k' -c 'read -P 0xcd 1M 4k' \
        -c 'read -P 0 4M 64k' -c 'read -P 0x33 5248k 128k' >"$tmpdir/qemu-io.out" ||
        { cat "$tmpdir/qemu-io.out" >&2; fail "qemu-io read-back from the origin failed"; }
    # Nothing written to the origin shows on the snapshot.
    if qemu-io -f raw "$s_uri" -c 'read -P 0xab 0 64k' >/dev/null 2>&1; then
        fail "origin write (pattern 0xab) visible on the snapshot"
    fi
    # A discard on the origin (contents unspecified afterwards): the
    # snapshot must keep the old data.
    qemu-io -f raw "$o_uri" -c 'discard 6M 256k' >/dev/null ||
        fail "qemu-io discard on the origin failed"
    qemu-io -f raw "$o_uri" -c 'write -P 0x44 6M 256k' >/dev/null
    qemu-io -f raw "$expected" -c 'write -P 0x44 6M 256k' >/dev/null
    info "qemu-io wrote the origin"
fi

snapshot_equals "$orig" "after origin writes"
origin_equals "$expected" "after origin writes"

# --- 2. bulk parallel writes to the origin: qemu-img convert -W -------
if have qemu-img; then
    make_random_image "$tmpdir/new-origin.img" "$size"
    qemu-img convert -n -W -m 8 -f raw -O raw "$tmpdir/new-origin.img" "$o_uri"
    cp "$tmpdir/new-origin.img" "$expected"
    snapshot_equals "$orig" "after qemu-img convert -W to the origin"
    origin_equals "$expected" "after qemu-img convert -W to the origin"
fi

# --- 3. nbdcopy with several connections to the snapshot --------------
if have nbdcopy; then
    make_random_image "$tmpdir/new-snapshot.img" "$size"
    nbdcopy --connections=4 --requests=16 "$tmpdir/new-snapshot.img" "$s_uri"
    snapshot_equals "$tmpdir/new-snapshot.img" "after nbdcopy to the snapshot"
    origin_equals "$expected" "after nbdcopy to the snapshot"
    # And nbdcopy with several connections to the origin.
    make_random_image "$tmpdir/new-origin2.img" "$size"
    nbdcopy --connections=4 "$tmpdir/new-origin2.img" "$o_uri"
    cp "$tmpdir/new-origin2.img" "$expected"
    snapshot_equals "$tmpdir/new-snapshot.img" "after nbdcopy to the origin"
    origin_equals "$expected" "after nbdcopy to the origin"
fi

# --- 4. nbdinfo --list ------------------------------------------------
if have nbdinfo; then
    nbdinfo --list "$(uri "$sock")" >"$tmpdir/list.out"
    grep -qx 'export="origin":' "$tmpdir/list.out" || fail "nbdinfo --list lacks origin"
    grep -qx 'export="snapshot":' "$tmpdir/list.out" || fail "nbdinfo --list lacks snapshot"
    [ "$(grep -c 'description:' "$tmpdir/list.out")" -ge 2 ] ||
        fail "nbdinfo --list lacks descriptions"
    grep 'description:' "$tmpdir/list.out"
fi
if have qemu-img; then
    # The top-level "virtual-size" (QEMU 10 also reports one per child
    # node, so the JSON must be parsed, not grepped).
    vsize=$(qemu-img info --output=json "$s_uri" |
            "$PY" -c 'import json, sys; print(json.load(sys.stdin)["virtual-size"])')
    [ "$vsize" -eq "$size" ] || fail "qemu-img info: snapshot virtual size $vsize != $size"
fi

stop_nbdkit "$pid"
cmp "$origin" "$expected" || fail "origin file differs from what the clients wrote"
[ "$(file_size "$cow")" -eq 0 ] || fail "transient COW file not truncated on exit"
finish
