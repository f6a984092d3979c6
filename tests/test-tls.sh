#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# TLS with a pre-shared key, exactly as the README and the man page show:
#   psktool -u alice -p keys.psk
#   nbdkit --tls=require --tls-psk=keys.psk snapfg ...
#   nbdcopy 'nbds+unix://alice@/snapshot?socket=SOCK&tls-psk-file=keys.psk' backup.img
#   qemu-img convert --object tls-creds-psk,id=tls0,endpoint=client,dir=DIR,username=alice \
#       --image-opts driver=nbd,server.type=unix,server.path=SOCK,export=snapshot,tls-creds=tls0 \
#       -O raw backup.img
# qemu-io writes the origin over TLS; then nbdcopy and qemu-img read the
# snapshot (= the original image) and the origin (= original + the write)
# over TLS, byte for byte.  A client without TLS, or with a wrong key,
# is refused.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg
requires psktool nbdcopy nbdinfo qemu-img qemu-io cmp

MIB=1048576
size=$((8 * MIB))
sock=$tmpdir/sock
pid=$tmpdir/nbdkit.pid
keys=$tmpdir/keys          # QEMU reads DIR/keys.psk
mkdir -p "$keys"
psk=$keys/keys.psk
psktool -u alice -p "$psk" >/dev/null
grep -q '^alice:' "$psk" || fail "psktool did not write a key for alice into $psk"

make_random_image "$tmpdir/original.img" "$size"
cp "$tmpdir/original.img" "$tmpdir/origin.img"
cp "$tmpdir/original.img" "$tmpdir/expected.img"

NBDKIT_OPTS="${NBDKIT_OPTS:-} --tls=require --tls-psk=$psk" \
    start_snapfg "$sock" "$pid" origin="$tmpdir/origin.img" cow="$tmpdir/cow.img" \
    store=persistent chunk-size=4K

tls_uri() { echo "nbds+unix://alice@/$1?socket=$sock&tls-psk-file=$psk"; }
qemu_tls=(--object "tls-creds-psk,id=tls0,endpoint=client,dir=$keys,username=alice")
qemu_opts() { echo "driver=nbd,server.type=unix,server.path=$sock,export=$1,tls-creds=tls0"; }

# --- refused without TLS or with the wrong key -------------------------
if nbdinfo --size "$(uri "$sock" origin)" >"$tmpdir/plain.out" 2>&1; then
    check_fail "a client without TLS was served (--tls=require): $(cat "$tmpdir/plain.out")"
else
    info "ok: a client without TLS is refused ($(tail -n 1 "$tmpdir/plain.out"))"
fi
psktool -u alice -p "$tmpdir/wrong.psk" >/dev/null
if nbdinfo --size "nbds+unix://alice@/origin?socket=$sock&tls-psk-file=$tmpdir/wrong.psk" \
        >"$tmpdir/wrong.out" 2>&1; then
    check_fail "a client with the wrong key was served: $(cat "$tmpdir/wrong.out")"
else
    info "ok: a client with the wrong key is refused"
fi

# --- writes and reads over TLS ----------------------------------------
[ "$(nbdinfo --size "$(tls_uri origin)")" = "$size" ] ||
    fail "nbdinfo over TLS: origin size is not $size"
# qemu-io writes 64 KiB of 0x5a at 1 MiB + 4 KiB through the origin
qemu-io "${qemu_tls[@]}" --image-opts "$(qemu_opts origin)" \
    -c "write -P 0x5a $((MIB + 4096)) 65536" -c flush >"$tmpdir/qemu-io.out" 2>&1 ||
    fail "qemu-io over TLS failed: $(cat "$tmpdir/qemu-io.out")"
head -c 65536 /dev/zero | tr '\0' '\132' >"$tmpdir/w.bin"
dd if="$tmpdir/w.bin" of="$tmpdir/expected.img" bs=4096 seek=$(((MIB + 4096) / 4096)) conv=notrunc status=none
info "qemu-io wrote 64 KiB over TLS"

export_equals "$(tls_uri snapshot)" "$tmpdir/original.img" \
    "nbdcopy over TLS: snapshot = original image"
export_equals "$(tls_uri origin)" "$tmpdir/expected.img" \
    "nbdcopy over TLS: origin = original + the qemu-io write"

# qemu_img_equals EXPORT FILE WHAT: qemu-img convert over TLS, then cmp.
qemu_img_equals() {
    rm -f "$tmpdir/qemu-img.out"
    qemu-img convert "${qemu_tls[@]}" --image-opts "$(qemu_opts "$1")" \
        -O raw "$tmpdir/qemu-img.out" 2>"$tmpdir/qemu-img.err" ||
        fail "qemu-img convert over TLS ($1) failed: $(cat "$tmpdir/qemu-img.err")"
    files_equal "$tmpdir/qemu-img.out" "$2" "$3"
}
qemu_img_equals snapshot "$tmpdir/original.img" "qemu-img convert over TLS: snapshot = original image"
qemu_img_equals origin "$tmpdir/expected.img" "qemu-img convert over TLS: origin = original + the qemu-io write"

stop_nbdkit "$pid"
cmp "$tmpdir/origin.img" "$tmpdir/expected.img" ||
    check_fail "the origin file differs from the expected image"
finish
