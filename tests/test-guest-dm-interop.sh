#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Interoperability of snapfg's persistent COW store with the Linux
# kernel's dm-snapshot (Debian's 6.1 kernel in a guest VM, driven by
# dmsetup; tests/guest/guest-lib.sh; skipped without qemu).  One boot:
#
# (a) snapfg -> kernel.  snapfg (store=persistent, 4K chunks) serves
#     origin writes (scattered whole chunks, more than one metadata area's
#     worth, and sub-chunk writes) and snapshot writes (whole and
#     sub-chunk) from the host; nbdkit stops.  The guest attaches the
#     origin and COW files as raw virtio disks (read-only) and loads
#     "snapshot ORIGIN COW P 8": its snapshot device must read exactly
#     what snapfg's snapshot export read (md5 of nbdcopy's copy), which
#     is also the original image plus the snapshot writes.
# (b) kernel -> snapfg.  On a fresh all-zero COW file the guest creates
#     "snapshot ... P 8" and then "snapshot-origin", writes through the
#     origin device (1.5 MiB: two metadata areas, and sub-chunk) and to
#     the snapshot device (whole and sub-chunk), prints the md5 of both
#     devices and removes them.  snapfg then opens the same files: its
#     snapshot export equals the kernel's snapshot view (md5) and the
#     bytes the host expects; its origin export equals the origin file.
# (d) kernel -> snapfg -> kernel, in the same boot.  After (b), the guest
#     asks the host (control port) to open the kernel's store in snapfg
#     (cow-size=4M: the store must not outgrow the guest's disk) and
#     append to it: 200 origin chunks (into the kernel's second metadata
#     area and on into a third) and a snapshot write; nbdkit stops.  The
#     guest's kernel loads the store again: its snapshot device reads what
#     snapfg's snapshot export read; the kernel then appends origin writes
#     to the same area (a stale pair after snapfg's terminator would come
#     alive here) and its snapshot device must still read the same.
#     Finally snapfg reads the store the kernel appended to: same again.
# (c) kernel-invalidated store -> snapfg.  A COW file too small for the
#     guest's origin writes (64 KiB, 4K chunks) overflows: the kernel
#     marks the store Invalid (header valid = 0, written by the kernel
#     itself).  snapfg opens it as Invalid: nbdinfo --list's description
#     says Invalid, snapshot reads fail, and the origin export works
#     (equals the file, accepts a write).
#     In (d), snapfg's binding record (the header chunk after dm's 16
#     bytes, written when snapfg first opened the kernel's store) is
#     still there, byte for byte, after the kernel loaded the store again
#     and appended to it: bytes 16..511 of the header chunk are unchanged
#     and snapfgctl inspect shows the binding.
# (e) The one header write of the kernel on an existing store: snapfg
#     creates a store (with its binding record); the guest's kernel loads
#     it and overflows it, so it marks it Invalid, rewriting the whole
#     header chunk (valid = 0, the rest zero: the binding goes with it).
#     snapfg then opens it as Invalid (an Invalid store is never served
#     as valid, binding or not).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/guest/guest-lib.sh"
require_snapfg
requires nbdcopy nbdinfo cmp md5sum od socat
PY=${SNAPFG_TEST_PYTHON:-/usr/bin/python3}
[ -x "$PY" ] && "$PY" -c 'import nbd' 2>/dev/null || skip "$PY with the nbd module (python3-libnbd) not found"
require_snapfgctl
guest_require

MIB=1048576
KIB=1024
size=$((8 * MIB))
sectors=$((size / 512))
guest_set SECTORS "$sectors"

# header_field COW N: the N-th little-endian 32-bit word of the header
# (0 magic, 1 valid, 2 version, 3 chunk size in sectors).
header_field() { od -An -t u4 --endian=little -j $(($2 * 4)) -N 4 "$1" | tr -d ' '; }

# ---------------------------------------------------------------- (a)
info "(a) snapfg writes a persistent COW store under host writes"
make_random_image "$tmpdir/a-origin.img" "$size"
cp "$tmpdir/a-origin.img" "$tmpdir/a-orig.img"
start_snapfg "$tmpdir/a.sock" "$tmpdir/a.pid" origin="$tmpdir/a-origin.img" cow="$tmpdir/a-cow.img" \
    store=persistent chunk-size=4K
# Origin writes: every 5th 4K chunk (410 exceptions, two metadata areas
# of 256 pairs), plus sub-chunk writes; snapshot writes: whole and
# sub-chunk.  The script keeps the expected images.
SOCK=$tmpdir/a.sock ORIG=$tmpdir/a-orig.img OUT=$tmpdir/a PYTHONPATH=$_fn_dir timeout 120 "$PY" - <<'PY' || fail "(a): host writes through snapfg failed"
import os, nbd
sock, orig, out = os.environ["SOCK"], os.environ["ORIG"], os.environ["OUT"]
origin = bytearray(open(orig, "rb").read())
snap = bytearray(origin)
from snapfg_test import connect_unix, write_tracked as w
o, s = connect_unix(sock, "origin"), connect_unix(sock, "snapshot")
for c in range(0, 2048, 5):
    w(o, origin, c * 4096, 4096)
w(o, origin, 7 * 2**20 + 512, 1024)           # sub-chunk
w(o, origin, 7 * 2**20 + 4096 - 512, 1024)    # sub-chunk, across a chunk boundary
w(s, snap, 2 * 2**20 + 4096, 8192)            # snapshot: two whole chunks
w(s, snap, 2 * 2**20 + 65536 + 512, 512)      # snapshot: sub-chunk
w(o, origin, 2 * 2**20 + 65536, 4096)         # origin write to that chunk afterwards
o.flush(); s.flush()
o.shutdown(); s.shutdown()
open(out + "-expect-origin.img", "wb").write(origin)
open(out + "-expect-snap.img", "wb").write(snap)
PY
copy_export_to "$(uri "$tmpdir/a.sock" snapshot)" "$tmpdir/a-snap.img" ||
    fail "(a): nbdcopy of snapfg's snapshot export failed: $(cat "$tmpdir/nbdcopy.err")"
check_files "$tmpdir/a-snap.img" "$tmpdir/a-expect-snap.img" "(a): snapfg's snapshot export = original + snapshot writes"
stop_nbdkit "$tmpdir/a.pid"
check_files "$tmpdir/a-origin.img" "$tmpdir/a-expect-origin.img" "(a): origin file = original + origin writes"
"$SNAPFGCTL" inspect "$tmpdir/a-cow.img" >"$tmpdir/a-inspect.out" 2>&1 || fail "(a): snapfgctl inspect failed: $(cat "$tmpdir/a-inspect.out")"
info "(a): snapfg's COW store: $(grep -E '^(valid|exceptions|metadata areas|status):' "$tmpdir/a-inspect.out" | tr '\n' ' ')"
a_status=$(sed -n 's/^status: //p' "$tmpdir/a-inspect.out")
guest_set A_SNAP_MD5 "$(md5_of "$tmpdir/a-snap.img")"
guest_set A_CHUNK_SECTORS "$(header_field "$tmpdir/a-cow.img" 3)"
guest_disk a-origin "$tmpdir/a-origin.img" ro
guest_disk a-cow "$tmpdir/a-cow.img" ro

# ---------------------------------------------------------------- (b)
make_random_image "$tmpdir/b-origin.img" "$size"
cp "$tmpdir/b-origin.img" "$tmpdir/b-orig.img"
make_zero_image "$tmpdir/b-cow.img" $((4 * MIB))
make_random_image "$tmpdir/b-o1" $((1536 * KIB))   # origin, at 1 MiB: 384 chunks
make_random_image "$tmpdir/b-o2" 1024              # origin, at 5 MiB + 512
make_random_image "$tmpdir/b-s1" $((8 * KIB))      # snapshot, at 6 MiB
make_random_image "$tmpdir/b-s2" 512               # snapshot, at 6 MiB + 64K + 512
for f in b-o1 b-o2 b-s1 b-s2; do guest_file "$tmpdir/$f" "$f"; done
cp "$tmpdir/b-orig.img" "$tmpdir/b-expect-origin.img"
patch_file "$tmpdir/b-expect-origin.img" $((1 * MIB)) "$tmpdir/b-o1"
patch_file "$tmpdir/b-expect-origin.img" $((5 * MIB + 512)) "$tmpdir/b-o2"
cp "$tmpdir/b-orig.img" "$tmpdir/b-expect-snap.img"
patch_file "$tmpdir/b-expect-snap.img" $((6 * MIB)) "$tmpdir/b-s1"
patch_file "$tmpdir/b-expect-snap.img" $((6 * MIB + 64 * KIB + 512)) "$tmpdir/b-s2"
guest_disk b-origin "$tmpdir/b-origin.img"
guest_disk b-cow "$tmpdir/b-cow.img"

# ---------------------------------------------------------------- (c)
make_random_image "$tmpdir/c-origin.img" "$size"
make_zero_image "$tmpdir/c-cow.img" $((64 * KIB))
make_random_image "$tmpdir/c-o1" "$MIB"
guest_file "$tmpdir/c-o1" c-o1
cp "$tmpdir/c-origin.img" "$tmpdir/c-expect-origin.img"
patch_file "$tmpdir/c-expect-origin.img" $((2 * MIB)) "$tmpdir/c-o1"
guest_disk c-origin "$tmpdir/c-origin.img"
guest_disk c-cow "$tmpdir/c-cow.img"

# ---------------------------------------------------------------- (e)
make_random_image "$tmpdir/e-origin.img" "$size"
start_snapfg "$tmpdir/e.sock" "$tmpdir/e.pid" origin="$tmpdir/e-origin.img" cow="$tmpdir/e-cow.img" \
    store=persistent chunk-size=4K
stop_nbdkit "$tmpdir/e.pid"
truncate -s $((64 * KIB)) "$tmpdir/e-cow.img"
"$SNAPFGCTL" inspect "$tmpdir/e-cow.img" >"$tmpdir/e-inspect.out" 2>&1 || true
grep -q '^binding: snapshot snapshot,' "$tmpdir/e-inspect.out" ||
    check_fail "(e): snapfg's new store has no binding record: $(cat "$tmpdir/e-inspect.out")"
dd if="$tmpdir/e-cow.img" of="$tmpdir/e-tail-before" bs=1 skip=16 count=496 status=none
guest_file "$tmpdir/c-o1" e-o1
guest_disk e-origin "$tmpdir/e-origin.img"
guest_disk e-cow "$tmpdir/e-cow.img"

# ---------------------------------------------------------------- (b) host
# check_b SNAP-MD5 ORIGIN-MD5 DM-STATUS: snapfg opens the store the kernel
# wrote in (b); the arguments are what the kernel reported.  Run from the
# guest's (d) request, before snapfg appends to the store.
b_checked=0
check_b() {
    b_checked=1
    info "(b) snapfg opens the kernel's COW store"
    check_files "$tmpdir/b-origin.img" "$tmpdir/b-expect-origin.img" "(b): origin file = original + the guest's origin writes"
    check_md5 "(b): the kernel's origin device = origin file" "$2" "$(md5_of "$tmpdir/b-origin.img")"
    "$SNAPFGCTL" inspect "$tmpdir/b-cow.img" >"$tmpdir/b-inspect.out" 2>&1 ||
        check_fail "(b): snapfgctl inspect of the kernel's store failed: $(cat "$tmpdir/b-inspect.out")"
    info "(b): the kernel's COW store: $(grep -E '^(valid|chunk size|exceptions|metadata areas|status):' "$tmpdir/b-inspect.out" | tr '\n' ' ')"
    check_status "(b): snapfgctl inspect of the kernel's store = the kernel's status" \
        "$3" "$(sed -n 's/^status: //p' "$tmpdir/b-inspect.out")"
    start_snapfg "$tmpdir/b.sock" "$tmpdir/b.pid" origin="$tmpdir/b-origin.img" cow="$tmpdir/b-cow.img"
    # snapfg's own status (nbdinfo --list): allocated and metadata sectors as
    # the kernel counted them (its total is the store's limit, cow-size=).
    local desc k d
    desc=$(nbdinfo --list "$(uri "$tmpdir/b.sock")" 2>&1 | awk '/^export="snapshot":/ { s = 1; next } /^export=/ { s = 0 }
           s && $1 == "description:" { sub(/^[ \t]*description: /, ""); print; exit }')
    k=$3 d=${desc##*: }
    if [ "${k%%/*} ${k##* }" = "${d%%/*} ${d##* }" ]; then
        info "ok: (b): snapfg's status '$d' counts the kernel's allocated and metadata sectors ('$k')"
    else
        check_fail "(b): snapfg's status '$d' (description '$desc') does not count what the kernel's '$k' does"
    fi
    if copy_export_to "$(uri "$tmpdir/b.sock" snapshot)" "$tmpdir/b-snap.img"; then
        check_md5 "(b): snapfg's snapshot export = the kernel's snapshot device" "$(md5_of "$tmpdir/b-snap.img")" "$1"
        check_files "$tmpdir/b-snap.img" "$tmpdir/b-expect-snap.img" "(b): snapfg's snapshot export = original + the guest's snapshot writes"
    else
        check_fail "(b): nbdcopy of snapfg's snapshot export failed: $(cat "$tmpdir/nbdcopy.err")"
    fi
    check_export "$(uri "$tmpdir/b.sock" origin)" "$tmpdir/b-origin.img" "(b): snapfg's origin export = origin file"
    stop_nbdkit "$tmpdir/b.pid"
}

# The kernel's "dmsetup status" of a store = snapfgctl inspect's (both
# "<allocated>/<total> <metadata>" sectors of the same file).
check_status() {  # WHAT KERNEL SNAPFG
    if [ "$2" = "$3" ]; then info "ok: $1: status '$2'"
    else check_fail "$1: the kernel's dmsetup status '$2', snapfg's '$3'"; fi
}

# (d) The guest's request "append-b SNAP-MD5 ORIGIN-MD5 DM-STATUS": check
# (b), then snapfg appends to the kernel's store.
d_done=0
ctl_handler() {
    GUEST_CTL_REPLY="FAIL"
    [ "$1" = append-b ] || { GUEST_CTL_REPLY="ERROR unknown request $1"; return 0; }
    d_done=1
    check_b "$2" "$3" "$(echo "$4" | tr _ ' ')"
    cp "$tmpdir/b-origin.img" "$tmpdir/d-before-origin.img"
    start_snapfg "$tmpdir/d.sock" "$tmpdir/d.pid" origin="$tmpdir/b-origin.img" cow="$tmpdir/b-cow.img" cow-size=4M
    if ! SOCK=$tmpdir/d.sock OUT=$tmpdir/d PYTHONPATH=$_fn_dir timeout 120 "$PY" - "$tmpdir/b-expect-snap.img" "$tmpdir/d-before-origin.img" <<'PY'
import os, sys, nbd
sock, out = os.environ["SOCK"], os.environ["OUT"]
snap = bytearray(open(sys.argv[1], "rb").read())
origin = bytearray(open(sys.argv[2], "rb").read())
from snapfg_test import connect_unix, write_tracked as w
o, s = connect_unix(sock, "origin"), connect_unix(sock, "snapshot")
for i in range(200):                            # chunks 1024, 1026, ... 1422
    w(o, origin, (1024 + 2 * i) * 4096, 4096)
w(s, snap, 1600 * 4096, 4096)                   # a snapshot write
o.flush(); s.flush()
o.shutdown(); s.shutdown()
open(out + "-expect-snap.img", "wb").write(snap)
open(out + "-expect-origin.img", "wb").write(origin)
PY
    then
        check_fail "(d): snapfg could not append to the kernel's store"
        stop_nbdkit "$tmpdir/d.pid"
        return 0
    fi
    check_export "$(uri "$tmpdir/d.sock" snapshot)" "$tmpdir/d-expect-snap.img" \
        "(d): snapfg's snapshot export of the kernel's store after snapfg's appends = expected"
    stop_nbdkit "$tmpdir/d.pid"
    dd if="$tmpdir/b-cow.img" of="$tmpdir/d-tail-before" bs=1 skip=16 count=496 status=none
    check_files "$tmpdir/b-origin.img" "$tmpdir/d-expect-origin.img" "(d): origin file after snapfg's appends = expected"
    "$SNAPFGCTL" inspect "$tmpdir/b-cow.img" >"$tmpdir/d-inspect.out" 2>&1 || true
    info "(d): the store after snapfg's appends: $(grep -E '^(valid|exceptions|metadata areas|status):' "$tmpdir/d-inspect.out" | tr '\n' ' ') ($(stat -c %s "$tmpdir/b-cow.img") bytes)"
    GUEST_CTL_REPLY="OK $(md5_of "$tmpdir/d-expect-snap.img")"
}
GUEST_CTL_HANDLER=ctl_handler

cat >"$tmpdir/guest.sh" <<'GUEST'
# --- runs in the guest (busybox sh), sourced by /init ---
for s in a-origin a-cow b-origin b-cow c-origin c-cow e-origin e-cow; do
    d=$(disk_by_serial "$s") || { fail "no virtio disk with serial $s"; continue; }
    eval "$(echo "$s" | tr - _)=$d"
done
say "disks: a $a_origin $a_cow, b $b_origin $b_cow, c $c_origin $c_cow"
# dm_status NAME KEY: print the snapshot's status and report it as KEY
# ("<allocated>/<total> <metadata>" in sectors, or Invalid).
dm_status() {
    st=$(dmc status "$1" 2>&1)
    say "dmsetup status $1: $st"
    val "$2" "$(echo "$st" | cut -d' ' -f4- | tr ' ' '_')"
}

say "=== (a) the kernel loads snapfg's COW store ==="
step "(a) dmsetup create"
if dmc create sfg-a --readonly --table "0 $SECTORS snapshot $a_origin $a_cow P $A_CHUNK_SECTORS" 2>/tmp/dm.err; then
    dm_status sfg-a a_dm_status
    expect_md5 "(a) the kernel's snapshot device reads what snapfg's snapshot export read" \
        "$(md5_dev /dev/mapper/sfg-a)" "$A_SNAP_MD5"
    dmc remove sfg-a || fail "(a) dmsetup remove sfg-a"
else
    fail "(a) dmsetup create snapshot over snapfg's store: $(cat /tmp/dm.err) $(dmesg | tail -n 5)"
fi

say "=== (b) the kernel writes a new COW store ==="
step "(b) dmsetup create"
# The snapshot table first, then snapshot-origin (the other order copies
# only the first chunk of multi-chunk origin writes).
if dmc create sfg-b-snap --table "0 $SECTORS snapshot $b_origin $b_cow P 8" 2>/tmp/dm.err &&
   dmc create sfg-b-origin --table "0 $SECTORS snapshot-origin $b_origin" 2>>/tmp/dm.err; then
    step "(b) writes"
    write_at /dev/mapper/sfg-b-origin /data/b-o1 65536 16
    write_at /dev/mapper/sfg-b-origin /data/b-o2 512 $(((5 * MIB + 512) / 512))
    write_at /dev/mapper/sfg-b-snap /data/b-s1 4096 $((6 * MIB / 4096))
    write_at /dev/mapper/sfg-b-snap /data/b-s2 512 $(((6 * MIB + 65536 + 512) / 512))
    sync
    echo 3 >/proc/sys/vm/drop_caches
    dm_status sfg-b-snap b_dm_status
    b_snap=$(md5_dev /dev/mapper/sfg-b-snap)
    b_orig=$(md5_dev /dev/mapper/sfg-b-origin)
    b_st=$(dmc status sfg-b-snap | cut -d' ' -f4- | tr ' ' _)
    val b_snap_md5 "$b_snap"
    val b_origin_md5 "$b_orig"
    step "(b) dmsetup remove"
    dmc remove sfg-b-origin || fail "(b) dmsetup remove sfg-b-origin"
    dmc remove sfg-b-snap || fail "(b) dmsetup remove sfg-b-snap"
    sync "$b_cow" "$b_origin"
else
    fail "(b) dmsetup create: $(cat /tmp/dm.err) $(dmesg | tail -n 5)"
fi

say "=== (d) snapfg appends to the kernel's store, the kernel reads and appends again ==="
step "(d) host appends"
if [ -n "${b_st:-}" ]; then
    reply=$(ctl append-b "$b_snap" "$b_orig" "$b_st")
else
    reply="(b) did not run"
fi
say "host: $reply"
case $reply in
OK*)
    want=${reply#OK }
    if dmc create sfg-d-snap --table "0 $SECTORS snapshot $b_origin $b_cow P 8" 2>/tmp/dm.err &&
       dmc create sfg-d-origin --table "0 $SECTORS snapshot-origin $b_origin" 2>>/tmp/dm.err; then
        dm_status sfg-d-snap d_dm_status
        expect_md5 "(d) the kernel's snapshot device reads what snapfg's snapshot export read after its appends" \
            "$(md5_dev /dev/mapper/sfg-d-snap)" "$want"
        step "(d) kernel appends"
        head -c 65536 /dev/urandom >/tmp/d-o1
        write_at /dev/mapper/sfg-d-origin /tmp/d-o1 65536 $((7 * MIB / 65536))
        sync
        echo 3 >/proc/sys/vm/drop_caches
        dm_status sfg-d-snap d_dm_status2
        expect_md5 "(d) after the kernel's own appends its snapshot device still reads the same" \
            "$(md5_dev /dev/mapper/sfg-d-snap)" "$want"
        val d_origin_md5 "$(md5_dev /dev/mapper/sfg-d-origin)"
        dmc remove sfg-d-origin || fail "(d) dmsetup remove sfg-d-origin"
        dmc remove sfg-d-snap || fail "(d) dmsetup remove sfg-d-snap"
        sync "$b_cow" "$b_origin"
    else
        fail "(d) dmsetup create over the store snapfg appended to: $(cat /tmp/dm.err) $(dmesg | tail -n 5)"
    fi ;;
*) fail "(d) the host could not append to the store: $reply" ;;
esac

say "=== (c) the kernel invalidates an overflowing COW store ==="
step "(c) dmsetup create"
if dmc create sfg-c-snap --table "0 $SECTORS snapshot $c_origin $c_cow P 8" 2>/tmp/dm.err &&
   dmc create sfg-c-origin --table "0 $SECTORS snapshot-origin $c_origin" 2>>/tmp/dm.err; then
    step "(c) writes"
    write_at /dev/mapper/sfg-c-origin /data/c-o1 65536 32 || true
    sync
    st=$(dmc status sfg-c-snap 2>&1)
    say "dmsetup status sfg-c-snap: $st"
    case $st in *Invalid*) say "ok: (c) the kernel reports the snapshot Invalid" ;;
                *) fail "(c) the kernel did not invalidate the overflowing snapshot: $st" ;; esac
    if dd if=/dev/mapper/sfg-c-snap of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null; then
        fail "(c) reading the kernel's invalid snapshot succeeded"
    else
        say "ok: (c) reading the kernel's invalid snapshot fails"
    fi
    val c_origin_md5 "$(md5_dev /dev/mapper/sfg-c-origin)"
    step "(c) dmsetup remove"
    dmc remove sfg-c-origin || fail "(c) dmsetup remove sfg-c-origin"
    dmc remove sfg-c-snap || fail "(c) dmsetup remove sfg-c-snap"
    sync "$c_cow" "$c_origin"
else
    fail "(c) dmsetup create: $(cat /tmp/dm.err) $(dmesg | tail -n 5)"
fi

say "=== (e) the kernel rewrites the header of snapfg's store ==="
step "(e) dmsetup create"
if dmc create sfg-e-snap --table "0 $SECTORS snapshot $e_origin $e_cow P 8" 2>/tmp/dm.err &&
   dmc create sfg-e-origin --table "0 $SECTORS snapshot-origin $e_origin" 2>>/tmp/dm.err; then
    write_at /dev/mapper/sfg-e-origin /data/e-o1 65536 32 || true
    sync
    st=$(dmc status sfg-e-snap 2>&1)
    say "dmsetup status sfg-e-snap: $st"
    case $st in *Invalid*) say "ok: (e) the kernel invalidated snapfg's store" ;;
                *) fail "(e) the kernel did not invalidate the overflowing store: $st" ;; esac
    dmc remove sfg-e-origin || fail "(e) dmsetup remove sfg-e-origin"
    dmc remove sfg-e-snap || fail "(e) dmsetup remove sfg-e-snap"
    sync "$e_cow" "$e_origin"
else
    fail "(e) dmsetup create over snapfg's store: $(cat /tmp/dm.err) $(dmesg | tail -n 5)"
fi
GUEST

guest_run "$tmpdir/guest.sh" || true

check_status "(a): the kernel's status of snapfg's store = snapfgctl inspect's" "$(guest_val a_dm_status | tr _ ' ')" "$a_status"

if [ "$b_checked" = 0 ] && [ -n "$(guest_val b_snap_md5)" ]; then
    check_b "$(guest_val b_snap_md5)" "$(guest_val b_origin_md5)" "$(guest_val b_dm_status | tr _ ' ')"
fi

# ---------------------------------------------------------------- (d) host
info "(d) snapfg reads the store after the kernel appended to it"
[ "$d_done" = 1 ] || check_fail "(d): the guest never asked the host to append"
if [ -f "$tmpdir/d-expect-snap.img" ]; then
    check_md5 "(d): the kernel's origin device = origin file" "$(guest_val d_origin_md5)" "$(md5_of "$tmpdir/b-origin.img")"
    "$SNAPFGCTL" inspect "$tmpdir/b-cow.img" >"$tmpdir/d-inspect2.out" 2>&1 ||
        check_fail "(d): snapfgctl inspect failed: $(cat "$tmpdir/d-inspect2.out")"
    info "(d): the store after the kernel's appends: $(grep -E '^(valid|exceptions|metadata areas|status):' "$tmpdir/d-inspect2.out" | tr '\n' ' ')"
    check_status "(d): the kernel's status = snapfgctl inspect's" \
        "$(guest_val d_dm_status2 | tr _ ' ')" "$(sed -n 's/^status: //p' "$tmpdir/d-inspect2.out")"
    dd if="$tmpdir/b-cow.img" of="$tmpdir/d-tail-after" bs=1 skip=16 count=496 status=none
    check_files "$tmpdir/d-tail-after" "$tmpdir/d-tail-before" \
        "(d): bytes 16..511 of the header chunk are as snapfg left them after the kernel's appends"
    grep -q '^binding: snapshot snapshot,.* start-up, state attached' "$tmpdir/d-inspect2.out" &&
        info "ok: (d): snapfgctl inspect still reads snapfg's binding: $(grep '^binding:' "$tmpdir/d-inspect2.out")" ||
        check_fail "(d): the binding after the kernel's appends: $(grep '^binding' "$tmpdir/d-inspect2.out")"
    start_snapfg "$tmpdir/d.sock" "$tmpdir/d.pid" origin="$tmpdir/b-origin.img" cow="$tmpdir/b-cow.img" cow-size=4M
    check_export "$(uri "$tmpdir/d.sock" snapshot)" "$tmpdir/d-expect-snap.img" \
        "(d): snapfg's snapshot export after the kernel's appends = expected"
    check_export "$(uri "$tmpdir/d.sock" origin)" "$tmpdir/b-origin.img" "(d): snapfg's origin export = origin file"
    stop_nbdkit "$tmpdir/d.pid"
fi

# ---------------------------------------------------------------- (c) host
info "(c) snapfg opens the store the kernel invalidated"
check_files "$tmpdir/c-origin.img" "$tmpdir/c-expect-origin.img" "(c): origin file = original + the guest's origin writes"
check_md5 "(c): the kernel's origin device = origin file" "$(guest_val c_origin_md5)" "$(md5_of "$tmpdir/c-origin.img")"
magic=$(header_field "$tmpdir/c-cow.img" 0) valid=$(header_field "$tmpdir/c-cow.img" 1)
if [ "$magic" = 1883336275 ] && [ "$valid" = 0 ]; then   # 0x70416e53 "SnAp"
    info "ok: (c): the kernel wrote header magic SnAp, valid = 0"
else
    check_fail "(c): COW header after the overflow: magic $magic valid $valid (want 1883336275, 0)"
fi
start_snapfg "$tmpdir/c.sock" "$tmpdir/c.pid" origin="$tmpdir/c-origin.img" cow="$tmpdir/c-cow.img"
nbdinfo --list "$(uri "$tmpdir/c.sock")" >"$tmpdir/c-list.out" 2>&1 || check_fail "(c): nbdinfo --list failed: $(cat "$tmpdir/c-list.out")"
desc=$(awk '/^export="snapshot":/ { s = 1; next } /^export=/ { s = 0 } s && $1 == "description:" { sub(/^[ \t]*description: /, ""); print; exit }' "$tmpdir/c-list.out")
case $desc in
    *Invalid*) info "ok: (c): nbdinfo --list describes the snapshot as Invalid: $desc" ;;
    *) check_fail "(c): snapshot description does not say Invalid: '$desc'" ;;
esac
# One small read at a time (nbdcopy would drop its connection with reads
# in flight on the first error, which nbdkit 1.32 does not survive).
st=0
SOCK=$tmpdir/c.sock timeout 60 "$PY" - >"$tmpdir/c-read.out" 2>&1 <<'PY' || st=$?
import os, sys, nbd
h = nbd.NBD()
h.set_export_name("snapshot")
try:
    h.connect_unix(os.environ["SOCK"])
except nbd.Error as e:
    print("connect refused:", e); sys.exit(3)
bad = 0
for off in (0, 2 * 2**20, 8 * 2**20 - 4096):
    try:
        h.pread(4096, off)
        print("read at %d succeeded" % off)
    except nbd.Error as e:
        bad += 1
        print("read at %d failed: %s" % (off, e))
h.shutdown()
sys.exit(0 if bad == 3 else 1)
PY
case $st in
    0) info "ok: (c): reads of the invalid snapshot export fail: $(head -n1 "$tmpdir/c-read.out")" ;;
    3) info "ok: (c): the invalid snapshot export refuses connections: $(cat "$tmpdir/c-read.out")" ;;
    *) check_fail "(c): reads of the invalid snapshot export: $(tr '\n' ' ' <"$tmpdir/c-read.out")" ;;
esac
check_export "$(uri "$tmpdir/c.sock" origin)" "$tmpdir/c-origin.img" "(c): snapfg's origin export = origin file"
SOCK=$tmpdir/c.sock timeout 60 "$PY" - <<'PY' && info "ok: (c): the origin export takes a write and reads it back" || check_fail "(c): write to the origin export failed"
import os, nbd
h = nbd.NBD()
h.set_export_name("origin")
h.connect_unix(os.environ["SOCK"])
buf = os.urandom(8192)
h.pwrite(buf, 4 * 2**20 + 4096)
h.flush()
assert h.pread(8192, 4 * 2**20 + 4096) == buf
h.shutdown()
PY
stop_nbdkit "$tmpdir/c.pid"

# ---------------------------------------------------------------- (e) host
info "(e) snapfg's store after the kernel invalidated it"
valid=$(header_field "$tmpdir/e-cow.img" 1)
[ "$valid" = 0 ] && info "ok: (e): the kernel wrote valid = 0" ||
    check_fail "(e): after the overflow the header says valid = $valid"
dd if="$tmpdir/e-cow.img" of="$tmpdir/e-tail-after" bs=1 skip=16 count=496 status=none
if cmp -s "$tmpdir/e-tail-after" "$tmpdir/e-tail-before"; then
    info "(e): the kernel kept bytes 16..511 when it invalidated the store"
elif [ "$(tr -d '\0' <"$tmpdir/e-tail-after" | wc -c)" = 0 ]; then
    info "(e): the kernel zeroed bytes 16..511 when it rewrote the header (the binding goes with the store's validity)"
else
    check_fail "(e): the kernel left bytes 16..511 neither as they were nor zero"
fi
"$SNAPFGCTL" inspect "$tmpdir/e-cow.img" >"$tmpdir/e-inspect2.out" 2>&1 || true
grep -q '^status: Invalid' "$tmpdir/e-inspect2.out" &&
    info "ok: (e): snapfgctl inspect: $(grep -E '^(binding|status):' "$tmpdir/e-inspect2.out" | tr '\n' ' ')" ||
    check_fail "(e): inspect after the kernel's invalidation: $(cat "$tmpdir/e-inspect2.out")"
start_snapfg "$tmpdir/e.sock" "$tmpdir/e.pid" origin="$tmpdir/e-origin.img" cow="$tmpdir/e-cow.img"
nbdinfo --list "$(uri "$tmpdir/e.sock")" 2>&1 | grep -q 'Invalid' &&
    info "ok: (e): snapfg opens the store the kernel invalidated as Invalid" ||
    check_fail "(e): snapfg's description of the store is not Invalid"
stop_nbdkit "$tmpdir/e.pid"
finish
