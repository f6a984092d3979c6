#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# set-block-size at run time: the advertised minimum block size flips
# between 512 and 4096 every 50 ms for ~10 s while clients read and write:
#
#   - nbd-check concurrency: 2 origin writers and 2 snapshot readers on
#     connections opened before the flipping starts (block size 512),
#     every snapshot read compared with the original image, the origin
#     compared with its model at the end;
#   - tests/control-io.py bs-clients: new connections one after another
#     (origin, the start-up snapshot, and snapB, a snapshot created at
#     run time), each doing I/O aligned to the minimum block size it was
#     given: reads of the origin's second half (nobody writes it) and of
#     the snapshot checked against the original image, reads and writes
#     of snapB checked against a model; and counting which minimum block
#     sizes new connections saw (must be 512 or 4096, and both).
#
# Every set-block-size must succeed and status must report the size just
# set; no client may see an error or a wrong byte; afterwards new
# connections (nbdinfo) see exactly the block size set last, on the
# origin, the start-up snapshot and a snapshot created at run time.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
require_nbd_check

size=$((8 * 1024 * 1024))
half=$((size / 2))
test_files "$size"
cow="$tmpdir/snapshot.cow"
seconds=${SNAPFG_BS_SECONDS:-10}

start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" control="$ctlsock"
ctl_ok "create snapB (written by bs-clients)" "$ctlsock" create snapB --cow "$tmpdir/snapB.cow" --chunk-size 16K

# nbd-check writes the origin's first half; bs-clients reads the second.
info "starting nbd-check concurrency (${seconds} s, 2 origin writers, 2 snapshot readers, region $half bytes)"
"$NBD_CHECK" concurrency --chunk 4096 --region "$half" --seed 7 \
    "$(uri "$sock" origin)" "$(uri "$sock" snapshot)" "$orig" "$seconds" 2 2 \
    >"$tmpdir/nbd-check.out" 2>&1 &
check_pid=$!
# Its connections are open once it prints its plan; start flipping then.
wait_until 60 grep -q 'concurrency: .* origin writers' "$tmpdir/nbd-check.out" 2>/dev/null ||
    { cat "$tmpdir/nbd-check.out" >&2; fail "nbd-check did not start"; }

"$PY" "$CTL_IO" bs-clients --sock "$sock" --original "$orig" \
    --region "$half:$half" --writable snapB --stop-file "$tmpdir/stop" >"$tmpdir/bs-clients.out" 2>&1 &
bs_pid=$!

info "flipping the block size every 50 ms while they run"
# For the run's seconds, and on a machine too busy for 20 changes in
# that time, on until 20 (bs-clients goes on until told to stop), for at
# most 120 s more: a count, not a speed.
flips=0 flip_errors=0 status_checked=0 end=$((SECONDS + seconds))
bs=4096
while [ "$SECONDS" -lt "$end" ] ||
      { [ "$flips" -lt 20 ] && [ "$SECONDS" -lt $((end + 120)) ]; }; do
    if ! ctl "$ctlsock" set-block-size "$bs"; then
        flip_errors=$((flip_errors + 1))
        check_fail "set-block-size $bs failed: $(cat "$tmpdir/ctl.err")"
    fi
    flips=$((flips + 1))
    if [ $((flips % 20)) -eq 0 ]; then
        # Nobody else changes it: status must say what was just set.
        ctl "$ctlsock" --json status || check_fail "status failed during the flipping"
        got=$(jq_py "$tmpdir/ctl.out" 'd["origin"]["block_size"]')
        [ "$got" = "$bs" ] || check_fail "status says block size $got right after set-block-size $bs"
        status_checked=$((status_checked + 1))
    fi
    bs=$((bs == 4096 ? 512 : 4096))
    sleep 0.05
done
info "$flips set-block-size commands ($flip_errors failed), status checked $status_checked times"
# (Each snapfgctl run waits for in-flight requests; on a busy machine
# that is far more than 50 ms.)
[ "$flips" -ge 20 ] || check_fail "only $flips block size changes in $((seconds + 120)) s"

st=0; wait "$check_pid" || st=$?
cat "$tmpdir/nbd-check.out"
if [ "$st" -eq 0 ]; then
    info "ok: nbd-check concurrency: no error, no wrong byte while the block size changed"
else
    check_fail "nbd-check concurrency failed (status $st) while the block size changed"
fi
touch "$tmpdir/stop"
st=0; wait "$bs_pid" || st=$?
cat "$tmpdir/bs-clients.out"
if [ "$st" -eq 0 ]; then
    info "ok: new connections saw 512 or 4096, did aligned I/O with no error and no wrong byte"
else
    check_fail "bs-clients failed (status $st)"
fi

# The final contents (nbd-check compared the origin with its model).
export_equals "$(uri "$sock" snapshot)" "$orig" "the snapshot still equals the original image"

# New connections see the block size set last.
ctl_ok "create snapshot snap2 at run time" "$ctlsock" create snap2 --cow "$tmpdir/snap2.cow"
for bs in 4096 512 4096 512; do
    ctl_ok "set-block-size $bs" "$ctlsock" set-block-size "$bs"
    for export in origin snapshot snap2 ""; do
        got=$(nbdinfo --json "$(uri "$sock" "$export")" |
              "$PY" -c 'import json,sys; print(json.load(sys.stdin)["exports"][0]["block_size_minimum"])') ||
            got="(nbdinfo failed)"
        if [ "$got" = "$bs" ]; then
            info "ok: after set-block-size $bs, a new connection to '${export}' sees minimum $got"
        else
            check_fail "after set-block-size $bs, a new connection to '${export}' sees minimum block size $got"
        fi
    done
    ctl "$ctlsock" status || true
    grep -q "block size $bs," "$tmpdir/ctl.out" ||
        check_fail "status does not say 'block size $bs': $(head -n1 "$tmpdir/ctl.out")"
done
# With 4096, a request aligned only to 512 is refused by libnbd (the
# promise is held); with 512 it is served.
ctl_ok "set-block-size 4096" "$ctlsock" set-block-size 4096
out=$(cio read "$(uri "$sock" origin)" 512 512 2>&1 || true)
case $out in
    ok) check_fail "a 512-byte read was sent although the minimum block size is 4096" ;;
    *) info "ok: with block size 4096, libnbd refuses a 512-aligned read ($(echo "$out" | tail -n1 | head -c 100))" ;;
esac
ctl_ok "set-block-size 512" "$ctlsock" set-block-size 512
out=$(cio read "$(uri "$sock" origin)" 512 512 2>&1 || true)
[ "$out" = ok ] && info "ok: with block size 512, a 512-aligned read is served" ||
    check_fail "with block size 512, a 512-aligned read: $out"

ctl "$ctlsock" drop snap2 || check_fail "drop snap2"
ctl "$ctlsock" drop snapB || check_fail "drop snapB"
stop_nbdkit "$pid"
finish
