#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Clients that vanish with large replies in flight (nbdkit before
# 1.33.10 aborts: "raw_send_socket: Assertion 'sock >= 0' failed").
#
# Round after round, while a writer writes 512-byte blocks to the origin
# (each acknowledged write logged), two clients queue 16-64 reads of
# 1-4 MiB each, one on the persistent snapshot and one on the origin,
# and exit without NBD_CMD_DISC (tests/client-drop.py).
#  - nbdkit >= 1.33.10: the server must survive every round.
#  - older nbdkit (Debian 12's 1.32.5): the aborts are counted; after
#    each one the server is started again with the same parameters (what
#    the service unit's Restart=on-failure does) and must serve the
#    snapshot byte for byte equal to the original image and an origin
#    holding every acknowledged write.
# At the end the origin file itself is checked the same way.
# The server runs with the default, writeback=on: every acknowledged
# write must survive an abort (held writes are replayed at the restart;
# test-writeback-crash.sh runs its loops with writeback=off too).
#   SNAPFG_DROP_ROUNDS=N   rounds (default 6; 24 under make check-soak)
#   NBDKIT_OPTS="-t 1"     e.g. to measure the single-thread mitigation
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg
requires nbdcopy cmp
"$PY" -c 'import nbd' 2>/dev/null || skip "$PY has no nbd module (python3-libnbd)"

rounds=${SNAPFG_DROP_ROUNDS:-$(soak_or 6 24)}
helper=$top_srcdir/tests/client-drop.py
MIB=1048576
size=$((64 * MIB))
blocks=$((size / 512))
sock=$tmpdir/sock
pid=$tmpdir/nbdkit.pid
make_random_image "$tmpdir/original.img" "$size"
cp "$tmpdir/original.img" "$tmpdir/origin.img"
params=(origin="$tmpdir/origin.img" cow="$tmpdir/cow.img" store=persistent chunk-size=4K)

# nbdkit >= 1.33.10 has upstream's fix ("server: Don't assert on send if
# client hangs up early").
ver=$(nbdkit --version | awk '{ print $2; exit }')
IFS=. read -r vmaj vmin vmic <<<"$ver"
fixed=0
if [ "$vmaj" -gt 1 ] || { [ "$vmaj" -eq 1 ] && { [ "$vmin" -gt 33 ] ||
        { [ "$vmin" -eq 33 ] && [ "${vmic:-0}" -ge 10 ]; }; }; }; then
    fixed=1
fi
info "nbdkit $ver ($([ $fixed = 1 ] && echo "has the fix: the server must never die" ||
    echo "before 1.33.10: aborts are counted, the data must survive them"))," \
    "${rounds} rounds, nbdkit options '${NBDKIT_OPTS:-}'"

start_snapfg "$sock" "$pid" "${params[@]}"
: >"$tmpdir/acks"
next=0 aborts=0 survived=0 other=0
declare -A how=()

# verify WHEN: the snapshot export equals the original image and the
# origin export holds every acknowledged write.
verify() {
    rm -f "$tmpdir/snap.img" "$tmpdir/orig-now.img"
    if ! timeout 120 nbdcopy "$(uri "$sock" snapshot)" "$tmpdir/snap.img" 2>"$tmpdir/copy.err"; then
        check_fail "$1: nbdcopy of the snapshot failed: $(head -c 300 "$tmpdir/copy.err")"
        return 0
    fi
    cmp -s "$tmpdir/snap.img" "$tmpdir/original.img" ||
        check_fail "$1: the snapshot differs from the original image: $(cmp "$tmpdir/snap.img" "$tmpdir/original.img" 2>&1 | head -c 200)"
    if ! timeout 120 nbdcopy "$(uri "$sock" origin)" "$tmpdir/orig-now.img" 2>"$tmpdir/copy.err"; then
        check_fail "$1: nbdcopy of the origin failed: $(head -c 300 "$tmpdir/copy.err")"
        return 0
    fi
    if out=$("$PY" "$helper" check "$tmpdir/orig-now.img" "$tmpdir/original.img" "$tmpdir/acks" "$next"); then
        info "$1: snapshot = original image; origin: $out"
    else
        check_fail "$1: origin export: $out"
    fi
}

for ((r = 1; r <= rounds; r++)); do
    rm -f "$tmpdir/stop"
    "$PY" "$helper" write "$(uri "$sock" origin)" "$next" "$blocks" "$tmpdir/acks" "$tmpdir/stop" \
        2>>"$tmpdir/writer.err" &
    wpid=$!
    sleep 0.3
    "$PY" "$helper" drop "$(uri "$sock" snapshot)" "$((r * 2))" 2>>"$tmpdir/drop.err" &
    d1=$!
    "$PY" "$helper" drop "$(uri "$sock" origin)" "$((r * 2 + 1))" 2>>"$tmpdir/drop.err" &
    d2=$!
    wait "$d1" || true
    wait "$d2" || true
    wait_nbdkit_death "$pid" 2
    touch "$tmpdir/stop"
    wait "$wpid" || check_fail "round $r: the writer failed: $(tail -n 2 "$tmpdir/writer.err")"
    # the next round starts past any write that was in flight
    last=$(tail -n 1 "$tmpdir/acks")
    next=$(( ${last:-$((next - 1))} + 2 ))
    [ "$next" -lt "$blocks" ] || next=$blocks
    if [ "$nbdkit_status" = alive ]; then
        survived=$((survived + 1))
        continue
    fi
    if grep -q "Assertion .sock >= 0. failed" "$pid.log"; then
        aborts=$((aborts + 1))
        how[assert]=$(grep -m1 "Assertion" "$pid.log")
    else
        other=$((other + 1))
        how[other]="status $nbdkit_status: $(tail -n 3 "$pid.log" | tr '\n' ' ')"
    fi
    cp "$pid.log" "$tmpdir/death-$r.log"
    if [ "$fixed" = 1 ]; then
        check_fail "round $r: nbdkit $ver died (status $nbdkit_status): $(tail -n 3 "$pid.log" | tr '\n' ' ')"
    fi
    # what Restart=on-failure does: the same parameters again
    start_snapfg "$sock" "$pid" "${params[@]}"
    verify "round $r: after the restart"
done

info "nbdkit $ver: ${rounds} rounds, ${aborts} aborts (sock >= 0 assertion), ${other} other deaths, ${survived} survived;" \
     "$(wc -l <"$tmpdir/acks") acknowledged origin writes"
[ -n "${how[assert]:-}" ] && info "the abort: ${how[assert]}"
[ "$other" -eq 0 ] || check_fail "nbdkit died otherwise than by the known assertion: ${how[other]}"
verify "end"
stop_nbdkit "$pid"
if out=$("$PY" "$helper" check "$tmpdir/origin.img" "$tmpdir/original.img" "$tmpdir/acks" "$next"); then
    info "origin file: $out"
else
    check_fail "origin file: $out"
fi
finish
