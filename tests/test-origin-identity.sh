#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The origin's identity in a store's binding: a file put in the origin's
# place (same path, same size) is another disk, and its snapshots are
# refused; origin-moved=true is the one way to say the origin really
# moved.
#
# 1. state= catalogue, snapshot s1 in STATE.d; the origin replaced by
#    rename (a copy, changed, renamed over it): the restart is refused,
#    by the catalogue (which records the identity too), saying what
#    changed (device and inode); store and catalogue unchanged.  With origin-moved=true: started, a notice,
#    s1 served (its copied-out chunks from the store, the rest from the
#    new file); the next start without it works (rebound).
# 2. The same with cow= (no catalogue).
# 3. The origin renamed (same file, another path): still its origin.
# 4. A binding without identity (as an older record or an NBD origin
#    has): matched by path and size, and it gains the identity; then a
#    replaced origin is refused.
# 5. Another size is never the origin, not even with origin-moved=true.
# 6. A block device renumbered (the origin's device node now names
#    another device number, holding the same data): refused, saying
#    which device number was recorded; origin-moved=true accepts it.
#    (Needs loop devices: skipped without them.)
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
source "$(dirname "$0")/persistent-functions.sh"

MiB=$((1024 * 1024))
size=$((8 * MiB))
test_files "$size"
pristine="$tmpdir/pristine.img"
expected="$tmpdir/expected.img"
state="$tmpdir/state.json"

origin_write() { # SEED OFFSET LENGTH
    cio writes "$(uri "$sock" origin)" --seed "$1" --list "$2:$3" >/dev/null ||
        fail "origin write failed"
}
# replace_origin: a changed copy of the origin renamed over it (same path,
# same size, another inode); $expected: what the snapshot must read then
# (the new file, with [0, 1 MiB) -- copied out before -- as it was).
replace_origin() {
    cp "$origin" "$tmpdir/new.img"
    head -c "$MiB" /dev/urandom |
        dd of="$tmpdir/new.img" bs="$MiB" seek=4 conv=notrunc status=none
    mv "$tmpdir/new.img" "$origin"
    cp "$origin" "$expected"
    dd if="$pristine" of="$expected" bs="$MiB" count=1 conv=notrunc status=none
}
# refused_replaced WHAT FILE PARAMS...: the start is refused, the message
# names FILE (or $who: the catalogue, which refuses first) and what
# changed; FILE (and the catalogue) unchanged.
refused_replaced() {
    local what=$1 file=$2 sum csum= who=${who:-cow=$2}
    shift 2
    sum=$(checksum "$file")
    [ -e "$state" ] && csum=$(checksum "$state")
    if try_start_failure "$tmpdir/start.err" "$@"; then
        try_stderr "$tmpdir/start.err" "$who" "the origin was replaced" "inode" "origin-moved=true" &&
            info "ok: $what: refused: $(grep -m1 -F "was replaced" "$tmpdir/start.err")"
    fi
    [ "$(checksum "$file")" = "$sum" ] || check_fail "$what: $file was changed"
    [ -z "$csum" ] || [ "$(checksum "$state")" = "$csum" ] || check_fail "$what: the catalogue was changed"
}
identity_of() { "$SNAPFGCTL" inspect "$1" | sed -n 's/^binding origin identity: //p'; }

# ---- 1. with a catalogue ------------------------------------------------
info "=== 1. state= catalogue, the origin replaced by rename"
make_random_image "$origin" "$size"
cp "$origin" "$pristine"
start_snapfg "$sock" "$pid" origin="$origin" state="$state" control="$ctlsock"
ctl_ok "create s1" "$ctlsock" create s1
origin_write 1 0 "$MiB"
stop_nbdkit "$pid"
C="$tmpdir/state.json.d/s1.cow"
[ -f "$C" ] || fail "no store at $C"
replace_origin
who="state=$state" refused_replaced "restart on the replaced origin" "$C" origin="$origin" state="$state"
start_snapfg "$sock" "$pid" origin="$origin" state="$state" origin-moved=true
grep -q "origin-moved=true: this store was bound to origin" "$pid.log" ||
    check_fail "origin-moved=true: no notice that the store was rebound"
grep -q "origin-moved=true: this catalogue was bound to origin" "$pid.log" ||
    check_fail "origin-moved=true: no notice that the catalogue was rebound"
export_equals "$(uri "$sock" s1)" "$expected" "origin-moved=true: s1 served"
stop_nbdkit "$pid"
start_snapfg "$sock" "$pid" origin="$origin" state="$state"
export_equals "$(uri "$sock" s1)" "$expected" "the next start without origin-moved: s1 served"
stop_nbdkit "$pid"

# ---- 2. cow= without a catalogue --------------------------------------------
info "=== 2. cow=, the origin replaced by rename"
rm -rf "$state" "$state.d"
make_random_image "$origin" "$size"
cp "$origin" "$pristine"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
origin_write 2 0 "$MiB"
stop_nbdkit "$pid"
replace_origin
refused_replaced "cow= on the replaced origin" "$cow" origin="$origin" cow="$cow"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" origin-moved=true
export_equals "$(uri "$sock" snapshot)" "$expected" "cow=, origin-moved=true: the snapshot"
stop_nbdkit "$pid"

# ---- 3. the origin renamed: the same file ------------------------------------
info "=== 3. the origin renamed (another path, the same file)"
mv "$origin" "$tmpdir/renamed.img"
start_snapfg "$sock" "$pid" origin="$tmpdir/renamed.img" cow="$cow"
export_equals "$(uri "$sock" snapshot)" "$expected" "the renamed origin: the snapshot"
stop_nbdkit "$pid"
mv "$tmpdir/renamed.img" "$origin"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"   # and back
export_equals "$(uri "$sock" snapshot)" "$expected" "renamed back: the snapshot"
stop_nbdkit "$pid"

# ---- 4. a binding without identity -------------------------------------------
info "=== 4. a binding record without the origin's identity"
# Zero the identity (binding bytes 40..55) and reseal the record's CRC.
"$PY" - "$cow" <<'EOF'
import struct, sys, zlib
path = sys.argv[1]
with open(path, "r+b") as f:
    f.seek(64)
    rec = bytearray(f.read(448))
    assert rec[:8] == b"snapfgBR"
    rec[40:56] = bytes(16)
    rec[444:448] = struct.pack("<I", zlib.crc32(bytes(rec[:444])) & 0xffffffff)
    f.seek(64)
    f.write(rec)
EOF
id=$(identity_of "$cow")
[ "$id" = "none (matched by path and size)" ] || fail "the identity was not cleared: '$id'"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
export_equals "$(uri "$sock" snapshot)" "$expected" "a binding without identity: the snapshot"
stop_nbdkit "$pid"
id=$(identity_of "$cow")
want="device $(stat -c %d "$origin") inode $(stat -c %i "$origin")"
[ "$id" = "$want" ] && info "ok: the binding gained the identity: $id" ||
    check_fail "after the attach the binding's identity is '$id', expected '$want'"
cp "$pristine" "$pristine.keep"
cp "$origin" "$pristine"     # what replace_origin keeps for [0, 1 MiB)
replace_origin
refused_replaced "the replaced origin, identity gained" "$cow" origin="$origin" cow="$cow"

# ---- 5. another size ------------------------------------------------------------
info "=== 5. another size is another origin, even with origin-moved=true"
truncate -s $((size + MiB)) "$origin"
sum=$(checksum "$cow")
if try_start_failure "$tmpdir/size.err" origin="$origin" cow="$cow" origin-moved=true; then
    try_stderr "$tmpdir/size.err" "cow=$cow" "belongs to another origin" "bytes" &&
        info "ok: another size refused: $(grep -m1 -F "another origin" "$tmpdir/size.err")"
fi
[ "$(checksum "$cow")" = "$sum" ] || check_fail "the refused store was changed"

# ---- 6. a block device renumbered ---------------------------------------------------
info "=== 6. a block device origin renumbered"
bsize=$((4 * MiB))
make_random_image "$tmpdir/a.img" "$bsize"
cp "$tmpdir/a.img" "$tmpdir/b.img"
cp "$tmpdir/a.img" "$pristine"
devs=()
for f in a b; do
    if d=$(losetup -f --show "$tmpdir/$f.img" 2>"$tmpdir/losetup.err"); then
        on_exit "losetup -d '$d'"
        devs+=("$d")
    fi
done
node="$tmpdir/disk-node"
mknode() { rm -f "$node"; mknod "$node" b $((0x$(stat -c %t "$1"))) $((0x$(stat -c %T "$1"))); }
if [ "${#devs[@]}" = 2 ] && mknode "${devs[0]}" 2>"$tmpdir/mknod.err"; then
    bcow="$tmpdir/block.cow"
    start_snapfg "$sock" "$pid" origin="$node" cow="$bcow"
    origin_write 6 0 "$MiB"
    stop_nbdkit "$pid"
    # The same disk (its data copied over) comes back as another number.
    dd if="${devs[0]}" of="${devs[1]}" bs="$MiB" conv=fsync status=none
    mknode "${devs[1]}"
    sum=$(checksum "$bcow")
    if try_start_failure "$tmpdir/block.err" origin="$node" cow="$bcow"; then
        try_stderr "$tmpdir/block.err" "cow=$bcow" "the origin was replaced" "block device" \
            "origin-moved=true" &&
            info "ok: the renumbered device refused: $(grep -m1 -F "was replaced" "$tmpdir/block.err")"
    fi
    [ "$(checksum "$bcow")" = "$sum" ] || check_fail "the refused store was changed"
    start_snapfg "$sock" "$pid" origin="$node" cow="$bcow" origin-moved=true
    export_equals "$(uri "$sock" snapshot)" "$pristine" "renumbered, origin-moved=true: the snapshot"
    stop_nbdkit "$pid"
    start_snapfg "$sock" "$pid" origin="$node" cow="$bcow"
    export_equals "$(uri "$sock" snapshot)" "$pristine" "renumbered and rebound: the snapshot"
    stop_nbdkit "$pid"
else
    skip_part "6, a block device renumbered: loop devices or device nodes are unavailable ($(cat "$tmpdir/losetup.err" "$tmpdir/mknod.err" 2>/dev/null | head -c 200))"
fi

finish
