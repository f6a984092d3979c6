#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The Linux kernel's NBD client (nbd-client 3.24, netlink) against snapfg,
# in a guest VM (tests/guest/guest-lib.sh; skipped without qemu).
#
# Two snapfg servers (persistent stores): A with block-size=512 and 4K
# chunks, B with block-size=4096 and 64K chunks.  For each, the guest
# attaches "origin" to /dev/nbd0 and "snapshot" to /dev/nbd1 (B with
# nbd-client -b 4096) and checks:
#   - device size and logical block size;
#   - the snapshot device reads the original image (md5 computed on the
#     host);
#   - dd oflag=direct writes (sub-chunk and unaligned to chunks, and
#     multi-chunk) read back; blkdiscard of a whole-chunk and a
#     sub-chunk range; sync + fsync of the device;
#   - the snapshot device still reads the original image;
#   - after nbd-client -d and a fresh attach (new connections) both
#     devices read the same again.
# Then A's origin is attached with -C 2 (two NBD connections, 2 vCPUs):
# two dd writers pinned to different CPUs, one fsync (NBD_CMD_FLUSH on one
# connection), and the host, while the guest is still connected, checks
# with nbdkit's log filter that the writes came over both connections
# and a flush followed, then reads the origin FILE (it must hold the data)
# and the COW store on disk (an exception for every written chunk).
# After the guest: each origin file equals the expected bytes (original +
# writes; discarded ranges zero, or unchanged if trim was ignored), the
# snapshot exports (nbdcopy) equal the original images, nbdkit exits
# cleanly, and after a restart on the same COW stores the snapshots still
# equal the originals.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/guest/guest-lib.sh"
require_snapfg
requires nbdcopy nbdinfo cmp md5sum socat
require_snapfgctl
GUEST_SMP=${SNAPFG_GUEST_SMP:-2}        # -C 2 needs two CPUs to use both connections
guest_require

MIB=1048576
KIB=1024
size=$((4 * MIB))
guest_set SIZE "$size"

# Per server: block size, chunk size, and the write/discard plan (bytes).
declare -A BS=([A]=512 [B]=4096) CHUNK=([A]=4096 [B]=65536)
for x in A B; do
    b=${BS[$x]}
    make_random_image "$tmpdir/orig-$x.img" "$size"
    cp "$tmpdir/orig-$x.img" "$tmpdir/origin-$x.img"
    cp "$tmpdir/orig-$x.img" "$tmpdir/expect-$x.img"      # discards -> zeroes
    cp "$tmpdir/orig-$x.img" "$tmpdir/expect-keep-$x.img" # discards ignored
    # W1 at 512K + 3 blocks: sub-chunk, not chunk-aligned, crossing a
    # chunk boundary
    make_random_image "$tmpdir/$x-w1" $((8 * KIB + b))
    # W2 at 1 MiB: 256 KiB over many chunks
    make_random_image "$tmpdir/$x-w2" $((256 * KIB))
    guest_file "$tmpdir/$x-w1" "$x-w1"
    guest_file "$tmpdir/$x-w2" "$x-w2"
    guest_set "${x}_ORIG_MD5" "$(md5_of "$tmpdir/orig-$x.img")"
    guest_set "${x}_BS" "$b"
    for f in expect-$x.img expect-keep-$x.img; do
        patch_file "$tmpdir/$f" $((512 * KIB + 3 * b)) "$tmpdir/$x-w1"
        patch_file "$tmpdir/$f" $((1 * MIB)) "$tmpdir/$x-w2"
    done
    # D1 at 2 MiB: 128 KiB (whole chunks), D2 at 2.5 MiB + 1 block: two
    # blocks inside one chunk
    zero_file "$tmpdir/expect-$x.img" $((2 * MIB)) $((128 * KIB))
    zero_file "$tmpdir/expect-$x.img" $((2560 * KIB + b)) $((2 * b))
done
# A, over -C 2: 512 KiB from CPU 0 at 3 MiB, 512 KiB from CPU 1 at 3.5 MiB
make_random_image "$tmpdir/A-w4a" $((512 * KIB))
make_random_image "$tmpdir/A-w4b" $((512 * KIB))
guest_file "$tmpdir/A-w4a" A-w4a
guest_file "$tmpdir/A-w4b" A-w4b
for f in expect-A.img expect-keep-A.img; do
    patch_file "$tmpdir/$f" $((3 * MIB)) "$tmpdir/A-w4a"
    patch_file "$tmpdir/$f" $((3584 * KIB)) "$tmpdir/A-w4b"
done

# A runs under nbdkit's log filter: the host sees which NBD connection
# carried each write and flush of the -C 2 part.
NBDKIT_OPTS="--filter=log" start_snapfg "$tmpdir/a.sock" "$tmpdir/a.pid" \
    origin="$tmpdir/origin-A.img" cow="$tmpdir/cow-A.img" \
    store=persistent chunk-size=4K block-size=512 logfile="$tmpdir/a-requests.log"
start_snapfg "$tmpdir/b.sock" "$tmpdir/b.pid" origin="$tmpdir/origin-B.img" cow="$tmpdir/cow-B.img" \
    store=persistent chunk-size=64K block-size=4096
info "servers: A (block-size=512, chunk 4K), B (block-size=4096, chunk 64K), persistent stores, $size-byte origins"

# One virtio-serial port per NBD connection the guest makes.
for p in o1 s1 o2 s2 m1 m2; do guest_nbd_port "A.$p" "$tmpdir/a.sock"; done
for p in o1 s1 o2 s2; do guest_nbd_port "B.$p" "$tmpdir/b.sock"; done

# The guest asks, after its fsync on the -C 2 device:
#   flushed X OFFSET LENGTH MD5
# and the host checks the origin file and the COW store on disk now.
flush_checked=0
ctl_handler() {
    local what=$1 x=$2 off=$3 len=$4 want=$5 got chunk first last missing
    [ "$what" = flushed ] || { GUEST_CTL_REPLY="ERROR unknown request $what"; return 0; }
    flush_checked=1
    got=$(dd if="$tmpdir/origin-$x.img" bs=64K skip=$((off / 65536)) count=$((len / 65536)) status=none | md5sum | cut -d' ' -f1)
    if [ "$got" != "$want" ]; then
        cp "$tmpdir/origin-$x.img" "$tmpdir/origin-$x-at-flush-check.img"   # for KEEP_TMP=1 post-mortems
        check_fail "after the guest's flush, origin file $x at $off+$len has md5 $got, the guest wrote $want"
        GUEST_CTL_REPLY="FAIL origin file md5 $got"
        return 0
    fi
    chunk=${CHUNK[$x]}
    first=$((off / chunk)) last=$(((off + len - 1) / chunk))
    "$SNAPFGCTL" inspect --exceptions "$tmpdir/cow-$x.img" >"$tmpdir/inspect-live.out" 2>&1 || true
    missing=$(awk -v f="$first" -v l="$last" '
        /^exceptions \(old_chunk/ { t = 1; next }
        t && NF == 2 && $1 ~ /^[0-9]+$/ { have[$1] = 1; next }
        t { t = 0 }
        END { n = 0; for (c = f; c <= l; c++) if (!(c in have)) n++; print n }' "$tmpdir/inspect-live.out")
    if [ "$missing" != 0 ]; then
        check_fail "after the guest's flush, COW store $x on disk lacks $missing of the exceptions for chunks $first..$last"
        cat "$tmpdir/inspect-live.out" >&2
        GUEST_CTL_REPLY="FAIL $missing exceptions missing on disk"
        return 0
    fi
    # Which connections carried the writes in the range, and the flushes
    # that followed them (nbdkit's log filter, in request order).
    local conns
    conns=$(awk -v lo="$off" -v hi=$((off + len)) '
        function hex(h,   i, n) {     # "0x1f" -> 31 (mawk has no strtonum)
            n = 0; h = tolower(substr(h, 3))
            for (i = 1; i <= length(h); i++) n = n * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
            return n
        }
        { c = ""; for (i = 1; i <= NF; i++) if ($i ~ /^connection=/) c = substr($i, 12) }
        c != "" && / Write id=/ {
            o = ""; for (i = 1; i <= NF; i++) if ($i ~ /^offset=/) o = hex(substr($i, 8))
            if (o >= lo && o < hi) { w[c]++; last = NR; delete f }
        }
        c != "" && / Flush id=/ && last { f[c]++ }
        END {
            nw = 0; for (c in w) { nw++; ws = ws " " c ":" w[c] }
            for (c in f) fs = fs " " c ":" f[c]
            printf "%d|%s|%s\n", nw, ws, fs
        }' "$tmpdir/a-requests.log")
    info "-C 2: writes in the range per connection (id:count):${conns#*|}" | sed 's/|/; flushes after the last of them:/'
    if [ "${conns%%|*}" -lt 2 ]; then
        check_fail "-C 2: the guest's writes used ${conns%%|*} connection(s), not 2: multi-conn flush not exercised"
        GUEST_CTL_REPLY="FAIL writes did not use two connections"
        return 0
    fi
    if [ -z "${conns##*|}" ]; then
        check_fail "-C 2: no flush reached the server after the guest's writes"
        GUEST_CTL_REPLY="FAIL no flush seen"
        return 0
    fi
    info "ok: while the guest is connected, after its flush: origin file $x holds its writes (md5 $got) and the COW store on disk has exceptions for chunks $first..$last"
    GUEST_CTL_REPLY="OK origin file and COW store hold the flushed writes"
}
GUEST_CTL_HANDLER=ctl_handler

cat >"$tmpdir/guest.sh" <<'GUEST'
# --- runs in the guest (busybox sh), sourced by /init ---
KIB=1024
Z128=$(head -c $((128 * KIB)) /dev/zero | md5sum | cut -d' ' -f1)

check_geometry() {  # DEV BS
    s=$(blockdev --getsize64 "$1"); ss=$(blockdev --getss "$1")
    if [ "$s" = "$SIZE" ] && [ "$ss" = "$2" ]; then say "ok: $1 size $s, logical block size $ss"
    else fail "$1: size $s (want $SIZE), logical block size $ss (want $2)"; fi
}

# run_server X [nbd-client options]: the attach/write/discard/detach cycle.
run_server() {
    x=$1; shift
    eval "orig=\$${x}_ORIG_MD5 b=\$${x}_BS"
    say "=== server $x: block size $b, nbd-client options: ${*:-none} ==="
    nbd_attach /dev/nbd0 origin "$x.o1" "$@" || return 0
    nbd_attach /dev/nbd1 snapshot "$x.s1" "$@" || { nbd_detach /dev/nbd0; return 0; }
    check_geometry /dev/nbd0 "$b"
    check_geometry /dev/nbd1 "$b"
    expect_md5 "$x: snapshot device reads the original image" "$(md5_dev /dev/nbd1)" "$orig"
    step "$x: writes"
    write_at /dev/nbd0 "/data/$x-w1" "$b" $(((512 * KIB + 3 * b) / b))
    write_at /dev/nbd0 "/data/$x-w2" 65536 $((1 * MIB / 65536))
    step "$x: discards"
    blkdiscard -o $((2 * MIB)) -l $((128 * KIB)) /dev/nbd0 && say "blkdiscard $((2 * MIB))+$((128 * KIB))" ||
        fail "$x: blkdiscard -o $((2 * MIB)) -l $((128 * KIB)) failed"
    blkdiscard -o $((2560 * KIB + b)) -l $((2 * b)) /dev/nbd0 && say "blkdiscard $((2560 * KIB + b))+$((2 * b))" ||
        fail "$x: blkdiscard -o $((2560 * KIB + b)) -l $((2 * b)) failed"
    step "$x: sync"
    sync
    sync /dev/nbd0 || fail "$x: fsync /dev/nbd0 failed"
    echo 3 >/proc/sys/vm/drop_caches
    w1len=$(wc -c <"/data/$x-w1")
    expect_md5 "$x: W1 reads back" "$(md5_dev /dev/nbd0 "$b" $((w1len / b)) $(((512 * KIB + 3 * b) / b)))" "$(md5_file "/data/$x-w1")"
    expect_md5 "$x: W2 reads back" "$(md5_dev /dev/nbd0 65536 4 16)" "$(md5_file "/data/$x-w2")"
    d=$(md5_dev /dev/nbd0 65536 2 32)
    if [ "$d" = "$Z128" ]; then say "$x: the discarded 128 KiB read as zeroes"
    else say "$x: the discarded 128 KiB do not read as zeroes (trim is advisory)"; fi
    expect_md5 "$x: snapshot device still reads the original image" "$(md5_dev /dev/nbd1)" "$orig"
    om=$(md5_dev /dev/nbd0)
    val "${x}_origin_md5" "$om"
    nbd_detach /dev/nbd0
    nbd_detach /dev/nbd1
    say "$x: re-attach over new connections"
    nbd_attach /dev/nbd0 origin "$x.o2" "$@" || return 0
    nbd_attach /dev/nbd1 snapshot "$x.s2" "$@" || { nbd_detach /dev/nbd0; return 0; }
    expect_md5 "$x: re-attached snapshot device reads the original image" "$(md5_dev /dev/nbd1)" "$orig"
    expect_md5 "$x: re-attached origin device reads what was written" "$(md5_dev /dev/nbd0)" "$om"
    nbd_detach /dev/nbd0
    nbd_detach /dev/nbd1
}

wait_for /dev/nbd1 50 || fail "/dev/nbd1 missing"
run_server A
run_server B -b 4096

say "=== server A: origin over two connections (nbd-client -C 2) ==="
if nbd_attach /dev/nbd0 origin "A.m1 A.m2" -C 2; then
    say "hardware queues of /dev/nbd0: $(ls /sys/block/nbd0/mq | wc -l)"
    step "-C 2: parallel writes"
    taskset 1 dd if=/data/A-w4a of=/dev/nbd0 bs=65536 seek=48 oflag=direct conv=notrunc 2>/tmp/w4a.err &
    p1=$!
    taskset 2 dd if=/data/A-w4b of=/dev/nbd0 bs=65536 seek=56 oflag=direct conv=notrunc 2>/tmp/w4b.err &
    p2=$!
    wait $p1 || fail "-C 2: write from CPU 0: $(cat /tmp/w4a.err)"
    wait $p2 || fail "-C 2: write from CPU 1: $(cat /tmp/w4b.err)"
    say "-C 2: wrote 512 KiB at 3 MiB from CPU 0 and 512 KiB at 3.5 MiB from CPU 1"
    step "-C 2: flush"
    sync
    taskset 1 sync /dev/nbd0 || fail "-C 2: fsync /dev/nbd0 failed"
    for q in /sys/block/nbd0/mq/*; do
        say "-C 2: hardware queue (connection) ${q##*/} serves CPUs $(cat "$q/cpu_list")"
    done
    want=$(cat /data/A-w4a /data/A-w4b | md5sum | cut -d' ' -f1)
    expect_md5 "-C 2: the device reads both writes" "$(md5_dev /dev/nbd0 $MIB 1 3)" "$want"
    step "-C 2: host check"
    reply=$(ctl flushed A $((3 * MIB)) $((1 * MIB)) "$want")
    say "host: $reply"
    case $reply in OK*) ;; *) fail "-C 2: host check after the flush: $reply" ;; esac
    val A_final_md5 "$(md5_dev /dev/nbd0)"
    nbd_detach /dev/nbd0
fi
GUEST

guest_run "$tmpdir/guest.sh" || true
[ "$flush_checked" = 1 ] || check_fail "the host never got the guest's flush check request"

# --- host checks after the guest ---------------------------------------
check_origin_file() {  # X
    local x=$1
    if cmp -s "$tmpdir/origin-$x.img" "$tmpdir/expect-$x.img"; then
        info "ok: origin file $x = original + the guest's writes, discarded ranges zero"
    elif cmp -s "$tmpdir/origin-$x.img" "$tmpdir/expect-keep-$x.img"; then
        info "ok: origin file $x = original + the guest's writes (discards left the data: trim is advisory)"
    else
        check_fail "origin file $x differs from the expected bytes: $(cmp "$tmpdir/origin-$x.img" "$tmpdir/expect-$x.img" 2>&1 | head -c 200)"
    fi
}
check_origin_file A
check_origin_file B
check_md5 "B: the guest's last view of the origin device = origin file" "$(guest_val B_origin_md5)" "$(md5_of "$tmpdir/origin-B.img")"
check_md5 "A: the guest's last view of the origin device = origin file" "$(guest_val A_final_md5)" "$(md5_of "$tmpdir/origin-A.img")"
for x in A B; do
    s=$(echo "$x" | tr AB ab)
    check_export "$(uri "$tmpdir/$s.sock" snapshot)" "$tmpdir/orig-$x.img" "$x: snapshot export (nbdcopy) = original image"
    check_export "$(uri "$tmpdir/$s.sock" origin)" "$tmpdir/origin-$x.img" "$x: origin export (nbdcopy) = origin file"
    stop_nbdkit "$tmpdir/$s.pid"
    "$SNAPFGCTL" inspect "$tmpdir/cow-$x.img" >"$tmpdir/inspect-$x.out" 2>&1 ||
        check_fail "$x: snapfgctl inspect failed: $(cat "$tmpdir/inspect-$x.out")"
    grep -qx 'valid: 1' "$tmpdir/inspect-$x.out" || check_fail "$x: COW store not valid: $(cat "$tmpdir/inspect-$x.out")"
    info "$x: COW store: $(grep -E '^(exceptions|status):' "$tmpdir/inspect-$x.out" | tr '\n' ' ')"
    # Reopen the persistent store: the snapshot survives the restart.
    start_snapfg "$tmpdir/$s.sock" "$tmpdir/$s.pid" origin="$tmpdir/origin-$x.img" cow="$tmpdir/cow-$x.img"
    check_export "$(uri "$tmpdir/$s.sock" snapshot)" "$tmpdir/orig-$x.img" "$x: after a restart, snapshot export = original image"
    stop_nbdkit "$tmpdir/$s.pid"
done
finish
