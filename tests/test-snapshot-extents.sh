#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Block status of a snapshot while its origin changes.  Where no
# exception was ever added, the snapshot answers with the origin's
# allocation (asked first, trusted only if the region is still untouched
# after); everywhere else it answers chunk by chunk.  A snapshot that
# reported a hole or zeroes where its data is would make nbdcopy and
# qemu-img convert, which skip what block status calls zero, copy
# zeroes instead of the snapshot's data: every check below is of that.
#
# A sparse origin (data in every other MiB, holes between) and a
# persistent snapshot of it, then:
#  1. the origin's data trimmed, zeroed and overwritten, its holes
#     written: the snapshot still reports data where it has data, and
#     still reports holes where nothing touched them;
#  2. a writer trims, zeroes and writes random pieces of the origin's
#     first half (each 4 MiB region touched for the first time while a
#     reader asks for block status) while the reader checks, over and
#     over, that every extent called zero reads as zero in the snapshot
#     as it was taken;
#  3. after a restart (the exceptions loaded from the store) the same;
#  4. nbdcopy and qemu-img convert of the snapshot equal it byte for
#     byte.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
requires nbdkit truncate

test_files
test_seed
size=$((64 * 1024 * 1024))
snap="$tmpdir/snapshot.img"   # the snapshot's content, as taken

make_sparse_image "$origin" $((size / 1048576))
cp --sparse=always "$origin" "$snap"

start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" control="$ctlsock"

# The checker (URI MODEL [HOLES [PASSES [WHILE_FILE [STARTED_FILE]]]]):
# every extent of the snapshot reported ZERO is zero in MODEL; at least
# HOLES bytes are still reported as holes; PASSES passes over the whole
# export, or with WHILE_FILE as many as fit while it exists (at least
# PASSES); STARTED_FILE is made when it starts.  Prints "ok ..." or
# "BAD ...".
cat >"$tmpdir/check.py" <<'PYEOF'
import nbd, sys
uri, model = sys.argv[1], sys.argv[2]
holes_wanted = int(sys.argv[3]) if len(sys.argv) > 3 else 0
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
stop_file = sys.argv[5] if len(sys.argv) > 5 else None
started = sys.argv[6] if len(sys.argv) > 6 else None
import os
data = open(model, "rb").read()
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(uri)
size = h.get_size()
bad = 0
done = 0
if started:
    open(started, "w").close()
while True:
    pos, holes = 0, 0
    while pos < size:
        got = []
        def cb(ctx, off, entries, err):
            if ctx == nbd.CONTEXT_BASE_ALLOCATION:
                got.extend(entries)
        h.block_status(size - pos, pos, cb)
        for i in range(0, len(got), 2):
            length, flags = got[i], got[i + 1]
            if flags & nbd.STATE_HOLE:
                holes += length
            if flags & nbd.STATE_ZERO and data[pos:pos + length].count(0) != length:
                bad += 1
                if bad <= 5:
                    print("BAD block status calls [%d, +%d) zero (flags %d); the snapshot has data there"
                          % (pos, length, flags))
            pos += length
    done += 1
    if stop_file is None and done >= rounds:
        break
    if stop_file is not None and not os.path.exists(stop_file):
        if done < rounds:
            print("BAD only %d passes of block status while the origin changed: the test did not test that" % done)
        break
if bad:
    print("BAD %d extents called zero over the snapshot's data in %d passes" % (bad, done))
else:
    print("ok: %d passes of block status, no extent called zero over data" % done)
if holes < holes_wanted:
    print("BAD only %d bytes reported as holes, want %d: the snapshot no longer reports its holes" % (holes, holes_wanted))
elif holes_wanted:
    print("ok: %d bytes still reported as holes" % holes)
h.shutdown()
PYEOF
verdicts() {
    local verdict rest
    while read -r verdict rest; do
        case $verdict in
            ok|ok:) info "ok: $rest" ;;
            BAD) check_fail "$1: $rest" ;;
            *) echo "$verdict $rest" ;;
        esac
    done
}
check() {   # WHAT [HOLES]
    "$PY" "$tmpdir/check.py" "$(uri "$sock" snapshot)" "$snap" "${2:-0}" \
        >"$tmpdir/check.out" 2>&1 || check_fail "$1: the checker failed"
    verdicts "$1" <"$tmpdir/check.out"
}

check "the new snapshot" $((30 * 1048576))

# 1. Data trimmed, zeroed and overwritten, holes written, on the origin.
"$PY" - "$(uri "$sock" origin)" <<'PYEOF' || check_fail "changing the origin failed"
import nbd, os, sys
M = 1 << 20
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.trim(M, 0)                  # data MiB 0: a hole on the origin now
h.zero(M, 2 * M)              # data MiB 2: zeroes
h.zero(M, 4 * M, nbd.CMD_FLAG_NO_HOLE)
h.pwrite(os.urandom(M), 6 * M)
h.pwrite(os.urandom(M), 9 * M)  # hole MiB 9: data now
h.trim(64 * 1024, 8 * M + 4096)  # part of data MiB 8
h.flush()
h.shutdown()
PYEOF
check "after trims, zeroes and writes on the origin" $((28 * 1048576))
"$PY" - "$(uri "$sock" origin)" <<'PYEOF' >"$tmpdir/origin.out" || check_fail "reading the origin's block status failed"
import nbd, sys
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(sys.argv[1])
got = []
h.block_status(1 << 20, 0, lambda ctx, off, e, err: got.extend(e))
print("ok: the origin's trimmed MiB is a hole" if got[1] & nbd.STATE_HOLE
      else "BAD the origin's trimmed MiB 0 is not a hole (flags %d): the test tests nothing" % got[1])
h.shutdown()
PYEOF
verdicts "the origin after the trim" <"$tmpdir/origin.out"

# 2. A writer over the origin's first half, a reader checking meanwhile.
cat >"$tmpdir/writer.py" <<'PYEOF'
import nbd, os, random, sys, time
uri, seed, stop_file, started = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rnd = random.Random(seed)
M = 1 << 20
h = nbd.NBD()
h.connect_uri(uri)
for _ in range(3000):            # until the reader runs
    if os.path.exists(started):
        break
    time.sleep(0.01)
# Regions in random order, each first touched while the reader runs, and
# changed for a quarter of a second.
regions = list(range(8))
rnd.shuffle(regions)
n = 0
for region in regions:
    until = time.monotonic() + 0.25
    while time.monotonic() < until:
        off = region * 4 * M + rnd.randrange(0, 4 * M // 4096) * 4096
        length = min(rnd.choice([4096, 65536, 262144]), (region + 1) * 4 * M - off)
        op = rnd.randrange(3)
        if op == 0:
            h.trim(length, off)
        elif op == 1:
            h.zero(length, off)
        else:
            h.pwrite(os.urandom(length), off)
        n += 1
h.flush()
h.shutdown()
os.unlink(stop_file)
print("ok: %d trims, zeroes and writes on the origin" % n)
PYEOF
touch "$tmpdir/writing"
"$PY" "$tmpdir/writer.py" "$(uri "$sock" origin)" "$seed" "$tmpdir/writing" \
    "$tmpdir/reading" >"$tmpdir/writer.out" 2>&1 &
writer=$!
"$PY" "$tmpdir/check.py" "$(uri "$sock" snapshot)" "$snap" 0 2 "$tmpdir/writing" \
    "$tmpdir/reading" >"$tmpdir/check.out" 2>&1 ||
    check_fail "the checker during the writes failed"
wait "$writer" || check_fail "the writer failed: $(cat "$tmpdir/writer.out")"
verdicts "the writer" <"$tmpdir/writer.out"
verdicts "block status during the writes" <"$tmpdir/check.out"
check "after the writes" $((14 * 1048576))
export_equals "$(uri "$sock" snapshot)" "$snap" "nbdcopy of the snapshot"

# 3. A restart: the exceptions come back from the store.
stop_nbdkit "$pid"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" control="$ctlsock"
check "after a restart" $((14 * 1048576))

# 4. The readers that trust block status.
export_equals "$(uri "$sock" snapshot)" "$snap" "nbdcopy of the snapshot after the restart"
if have qemu-img; then
    rm -f "$tmpdir/qemu.img"
    qemu-img convert -f raw -O raw "$(uri "$sock" snapshot)" "$tmpdir/qemu.img" &&
        files_equal "$tmpdir/qemu.img" "$snap" "qemu-img convert of the snapshot" ||
        check_fail "qemu-img convert of the snapshot failed"
fi
stop_nbdkit "$pid"
finish
