#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Block status of the origin with writes held by write-back (issue 29):
# a held write is data the origin file does not have yet, and must never
# be reported as a hole or zero, or a reader that trusts block status
# (nbdcopy, qemu-img convert, QEMU's mirror and backup jobs) copies
# zeroes where the client wrote data.
#
# A sparse origin (data in every other MiB, holes between) with a
# persistent snapshot; the committer paused (SNAPFG_TEST_WRITEBACK_PAUSE)
# so that the writes stay held.  200 acknowledged 64 KiB writes into the
# holes (and a few over data), then:
#  - block_status (nbdsh) over each write says data, never HOLE or ZERO,
#    and a read returns the data;
#  - nbdcopy of the origin export equals the expected image, byte for
#    byte; so does qemu-img convert where it is installed;
#  - a held zero over data may still be data, a hole stays a hole where
#    nothing is held (the holes are still reported: not all data);
#  - after the committer goes on and a flush, the origin file is the
#    expected image and nbdcopy still agrees.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
requires nbdkit truncate

test_files
test_seed
pause="$tmpdir/pause"
size=$((64 * 1024 * 1024))
expected="$tmpdir/expected.img"

# The origin: sparse, data in every other MiB.
make_sparse_image "$origin" $((size / 1048576))
cp --sparse=always "$origin" "$expected"

touch "$pause"
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" start_snapfg "$sock" "$pid" \
    origin="$origin" cow="$cow" control="$ctlsock" writeback=on \
    writeback-max=64M

# 200 64 KiB writes into the holes (odd MiBs), 16 to a MiB, not all of
# each hole: some of it stays a hole.  The model gets the same bytes.
"$PY" - "$(uri "$sock" origin)" "$expected" "$seed" >"$tmpdir/held.out" <<'PYEOF' ||
import nbd, os, random, sys
uri, model, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(seed)
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(uri)
slots = [(mib * 16 + k) * 65536 for mib in range(1, 64, 2) for k in range(16)]
# Leave one slot of each hole unwritten: holes must stay reportable.
slots = [s for s in slots if (s // 65536) % 16 != 15]
offsets = sorted(rnd.sample(slots, 200))
with open(model, "r+b") as f:
    for off in offsets:
        data = os.urandom(65536)
        h.pwrite(data, off)
        f.seek(off)
        f.write(data)
# Block status over each write: data, and a read returns it.
bad = 0
for off in offsets:
    seen = []
    def cb(metacontext, offset, entries, err):
        if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
            seen.extend(entries)
    h.block_status(65536, off, cb)
    flags = seen[1] if len(seen) >= 2 else None
    if flags is None or seen[0] < 65536 or flags & (nbd.STATE_HOLE | nbd.STATE_ZERO):
        bad += 1
        if bad <= 5:
            print("BAD block_status at %d: %s" % (off, seen))
    with open(model, "rb") as f:
        f.seek(off)
        if h.pread(65536, off) != f.read(65536):
            print("BAD read at %d does not return the held data" % off)
# Holes with nothing held in them are still reported as holes.
holes = 0
pos = 0
while pos < h.get_size():
    got = []
    def cb2(metacontext, offset, entries, err):
        if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
            got.extend(entries)
    h.block_status(h.get_size() - pos, pos, cb2)
    for i in range(0, len(got), 2):
        if got[i + 1] & nbd.STATE_HOLE:
            holes += got[i]
    pos += sum(got[0::2])
print("ok: %d of 200 held writes reported as data" % (200 - bad) if bad == 0
      else "BAD %d of 200 held writes reported as a hole or zero" % bad)
print("ok: %d bytes still reported as holes" % holes if holes > 0
      else "BAD nothing is reported as a hole any more")
h.shutdown()
PYEOF
    check_fail "the writes or block status failed"
while read -r verdict rest; do
    case $verdict in
        ok|ok:) info "ok: $rest" ;;
        BAD) check_fail "$rest" ;;
        *) echo "$verdict $rest" ;;
    esac
done <"$tmpdir/held.out"

held=$("$SNAPFGCTL" --socket "$ctlsock" stats --json |
       "$PY" -c 'import json,sys; print([x for x in json.load(sys.stdin)["exports"] if x["export"] == "origin"][0]["writeback_held_writes"])')
[ "$held" -ge 200 ] && info "ok: $held writes held while block status is read" ||
    check_fail "only $held writes are held: the test did not test held writes"

# The readers that trust block status.
export_equals "$(uri "$sock" origin)" "$expected" \
    "nbdcopy of the origin with 200 writes held"
if have qemu-img; then
    rm -f "$tmpdir/qemu.img"
    qemu-img convert -f raw -O raw "$(uri "$sock" origin)" "$tmpdir/qemu.img" &&
        files_equal "$tmpdir/qemu.img" "$expected" \
            "qemu-img convert of the origin with 200 writes held" ||
        check_fail "qemu-img convert of the origin failed"
fi
# Nothing of it reached the origin file yet.
cmp -s "$origin" "$expected" &&
    check_fail "the origin file already has the writes: they were not held"

rm -f "$pause"
"$PY" -m nbd -u "$(uri "$sock" origin)" -c 'h.flush()' ||
    check_fail "flush after the committer went on failed"
files_equal "$origin" "$expected" "the origin file after the flush"
export_equals "$(uri "$sock" origin)" "$expected" "nbdcopy after the flush"
stop_nbdkit "$pid"
finish
