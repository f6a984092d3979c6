#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The Debian 12 mitigation of nbdkit 1.32's client-drop abort, end to
# end: the server is killed and started again under a guest that keeps
# writing, and the guest must not notice.
#
# The guest's /dev/vda is the origin export opened by QEMU from an NBD
# URI with reconnect-delay=60 (-drive file=nbd+unix:///origin?socket=
# SOCK,file.reconnect-delay=60).  The guest writes 64 KiB blocks with
# dd oflag=direct over and over (a 4 MiB region, the same data each
# pass) while the host, asked by the guest three times, kills nbdkit
# with SIGKILL and starts it again with the same parameters (what the
# service unit's Restart=on-failure does).  Then:
#   - no dd failed, the guest's kernel logged no I/O error, and the
#     writer made progress after each restart;
#   - the guest reads the region back (O_DIRECT): it is what it wrote;
#   - host: the origin file = the original image + the writes, the
#     persistent snapshot (nbdcopy) = the original image.
# The server runs with the default, writeback=on.  Before the held file
# (issue 29) an abort lost the held writes no flush covered, and a
# client that reconnects cannot know: CI caught a block the guest wrote,
# held at a kill, read back as the original data.  Now the restart
# replays them before the guest's next request.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/guest/guest-lib.sh"
require_snapfg
requires nbdcopy cmp md5sum
guest_require

MIB=1048576
KIB=1024
size=$((16 * MIB))
nblocks=64            # 64 KiB blocks: a 4 MiB region from 2 MiB
make_random_image "$tmpdir/orig.img" "$size"
cp "$tmpdir/orig.img" "$tmpdir/origin.img"
make_random_image "$tmpdir/w" $((nblocks * 64 * KIB))
cp "$tmpdir/orig.img" "$tmpdir/expect.img"
patch_file "$tmpdir/expect.img" $((2 * MIB)) "$tmpdir/w"
guest_file "$tmpdir/w" w
guest_set NBLOCKS "$nblocks"
guest_set W_MD5 "$(md5_of "$tmpdir/w")"

sock=$tmpdir/sock
pid=$tmpdir/nbdkit.pid
params=(origin="$tmpdir/origin.img" cow="$tmpdir/cow.img" store=persistent chunk-size=4K)
start_snapfg "$sock" "$pid" "${params[@]}"
guest_nbd_uri_disk origin "$sock" origin reconnect-delay=60

restarts=0
ctl_handler() {
    [ "$1" = restart ] || { GUEST_CTL_REPLY="ERROR unknown request $1"; return 0; }
    local p
    p=$(nbdkit_pid "$pid")
    kill -KILL "$p"
    wait_nbdkit_death "$pid" 30
    if [ "$nbdkit_status" = alive ]; then
        GUEST_CTL_REPLY="FAIL nbdkit $p did not die of SIGKILL"; return 0
    fi
    info "killed nbdkit $p (status $nbdkit_status) while the guest writes; starting it again"
    sleep 1        # the guest's requests wait meanwhile
    start_snapfg "$sock" "$pid" "${params[@]}"
    restarts=$((restarts + 1))
    GUEST_CTL_REPLY="OK restarted $restarts"
}
GUEST_CTL_HANDLER=ctl_handler

cat >"$tmpdir/guest.sh" <<'GUEST'
# --- runs in the guest (busybox sh), sourced by /init ---
o=$(disk_by_serial origin) || fail "no virtio disk with serial origin"
base=$((2 * MIB / 65536))
# the writer: pass after pass over the region until /tmp/stop appears
(
    pass=0
    while [ ! -e /tmp/stop ]; do
        i=0
        while [ "$i" -lt "$NBLOCKS" ]; do
            if ! dd if=/data/w of="$o" bs=65536 skip="$i" seek=$((base + i)) count=1 \
                    oflag=direct conv=notrunc 2>/tmp/wdd.err; then
                echo "pass $pass block $i: $(cat /tmp/wdd.err | tr '\n' ' ')" >>/tmp/werr
            fi
            # renamed into place: a reader never sees a half-written file
            echo $((pass * NBLOCKS + i + 1)) >/tmp/wcount.tmp
            mv /tmp/wcount.tmp /tmp/wcount
            i=$((i + 1))
        done
        pass=$((pass + 1))
    done
) &
wpid=$!
wcount() { c=$(cat /tmp/wcount 2>/dev/null); echo "${c:-0}"; }
wait_progress() {   # wait_progress N: until N more blocks are written (<= 120 s)
    want=$(($(wcount) + $1)) t=0
    while [ "$(wcount)" -lt "$want" ] && [ "$t" -lt 1200 ]; do usleep 100000; t=$((t + 1)); done
    [ "$(wcount)" -ge "$want" ]
}
wait_progress 8 || fail "the writer did not start"
for k in 1 2 3; do
    step "restart $k"
    before=$(wcount)
    # (not in $(...): ctl keeps the port open in this shell)
    ctl restart >/tmp/ctl.out
    r=$(cat /tmp/ctl.out)
    case $r in OK*) say "host: $r (writer at block $before)" ;; *) fail "restart $k: $r" ;; esac
    if wait_progress 16; then say "writer went on after restart $k: $(wcount) blocks written"
    else fail "the writer made no progress within 120 s after restart $k (at $(wcount))"; fi
done
touch /tmp/stop
wait "$wpid"
say "writer done: $(wcount) blocks of 64 KiB written"
[ -s /tmp/werr ] && fail "writes failed: $(head -n 3 /tmp/werr | tr '\n' ' ')"
if dmesg | grep -iE 'I/O error|blk_update_request|Buffer I/O' >/tmp/ioerr; then
    fail "kernel I/O errors: $(head -n 3 /tmp/ioerr | tr '\n' ' ')"
else
    say "no I/O error in the kernel log"
fi
sync "$o" || fail "fsync $o failed"
expect_md5 "the region reads back what was written" "$(md5_dev "$o" 65536 "$NBLOCKS" "$base")" "$W_MD5"
val origin_md5 "$(md5_dev "$o")"
GUEST

guest_run "$tmpdir/guest.sh" || true

# --- host checks after the guest ---------------------------------------
[ "$restarts" -eq 3 ] && info "ok: nbdkit was killed and started again 3 times under the writing guest" ||
    check_fail "nbdkit was restarted $restarts times, expected 3"
grep -i reconnect "$_guest_work/qemu.log" 2>/dev/null | head -n 3 | sed "s/^/$test_name: qemu: /" || true
check_files "$tmpdir/origin.img" "$tmpdir/expect.img" "origin file = original image + the guest's writes"
check_md5 "the guest's last view of the origin = origin file" "$(guest_val origin_md5)" "$(md5_of "$tmpdir/origin.img")"
check_export "$(uri "$sock" snapshot)" "$tmpdir/orig.img" "persistent snapshot (nbdcopy) = original image, after 3 kills"
stop_nbdkit "$pid"
finish
