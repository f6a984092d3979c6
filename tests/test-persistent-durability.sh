#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# durability=flush: persistent commits are written in order (COW data,
# then its metadata area, then the origin) but synced only at client
# flush/FUA and at a clean close.  While a server writes the store that
# way, its header says valid = 0 and carries snapfg's unsynced mark with
# the boot id (SNAPFG_TEST_BOOT_ID stands in for the kernel's).
#
#  1. While running: the header has valid = 0 and the mark with this
#     boot's id (the kernel would refuse the store).
#  2. kill -9 loop: concurrent multi-chunk origin writers, nbdkit killed
#     mid-load; reopened in the same boot the snapshot equals the
#     pristine image and the origin export the origin file.
#  3. A clean stop syncs and clears the mark (valid = 1); the store then
#     opens in another boot, valid, with the snapshot intact.
#  4. An unclean system stop (kill -9, then a restart with another boot
#     id): the snapshot is Invalid (EIO, status Invalid), the header
#     says valid = 0 without the mark, and it stays Invalid in any boot.
#  5. Reopened with durability=sync in the same boot after a kill -9:
#     valid, synced, the mark cleared at once.
set -euo pipefail
# writeback=off: this loop asserts that every acknowledged write survives
# a kill -9 (write-back keeps that promise only for flushed writes).
source "$(dirname "$0")/persistent-functions.sh"
require_persistent_tools

persistent_test_files
size=$((16 * 1024 * 1024))
rounds=${SNAPFG_CRASH_ROUNDS:-$(soak_or 2 4)}

# mark COW: the unsynced mark in the header, bytes 32..63 ("SFGu" and the
# boot id; "" if none).
mark() {
    dd if="$1" bs=1 skip=32 count=32 status=none | tr -d '\0'
}

# fresh: a new origin, its pristine copy, no COW store.
fresh() {
    make_random_image "$origin" "$size"
    cp "$origin" "$pristine"
    rm -f "$cow"
}

# check_whole WHAT BOOT [PARAMS]: start in boot BOOT; the snapshot equals
# the pristine image and the origin export the origin file.
check_whole() {
    local what=$1 boot=$2
    shift 2
    SNAPFG_TEST_BOOT_ID=$boot start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" "$@"
    export_equals "$(uri "$sock" snapshot)" "$pristine" "$what: snapshot == pristine"
    export_equals "$(uri "$sock" origin)" "$origin" "$what: origin export == origin file"
}

# ---- 1. the header while running ----------------------------------------
info "=== durability=flush: the header while the server runs"
fresh
SNAPFG_TEST_BOOT_ID=boot-A start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" durability=flush writeback=off
pio write-random "$(uri "$sock" origin)" --seed "$seed" --count 40 --max-len 65536 >/dev/null
v=$(header_le32 "$cow" 4)
m=$(mark "$cow")
[ "$v" = 0 ] || check_fail "running with durability=flush: header valid = $v, expected 0"
[ "$m" = "SFGuboot-A" ] ||
    check_fail "running with durability=flush: header mark '$m', expected 'SFGuboot-A'"
info "ok: while running: valid = $v, mark '$m'"

# ---- 3. (on the same server) a clean stop clears the mark -----------------
stop_nbdkit "$pid"
v=$(header_le32 "$cow" 4)
m=$(mark "$cow")
[ "$v" = 1 ] || check_fail "after a clean stop: header valid = $v, expected 1"
[ -z "$m" ] || check_fail "after a clean stop: the header still carries '$m'"
info "ok: after a clean stop: valid = $v, no mark"
check_whole "clean stop, reopened in another boot" boot-B
stop_nbdkit "$pid"

# ---- 2. kill -9 loop --------------------------------------------------------
info "=== durability=flush: kill -9 loop, $rounds rounds, 3 writers"
fresh
for round in $(seq "$rounds"); do
    SNAPFG_TEST_BOOT_ID=boot-A start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" durability=flush writeback=off
    for w in 1 2 3; do
        pio writer-loop "$(uri "$sock" origin)" --seed $((seed + round * 10 + w)) \
            --max-len $((w == 3 ? 1048576 : 65536)) --in-flight 4 \
            --ready-file "$tmpdir/ready-$round-$w" 2>>"$tmpdir/writers.log" &
        writer_pids+=($!)
    done
    for _ in $(seq 300); do
        [ "$(ls "$tmpdir" | grep -c "^ready-$round-")" -eq 3 ] && break
        sleep 0.1
    done
    ms=$((300 + RANDOM % 1700))
    sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
    kill9_nbdkit "$pid"
    kill_writers
    info "round $round: killed nbdkit after ${ms} ms of writes"
    check_whole "kill -9 round $round, same boot" boot-A durability=flush
    stop_nbdkit "$pid"
done

# ---- 5. reopened with durability=sync after a kill -9 -----------------------
info "=== durability=flush, kill -9, reopened with durability=sync (same boot)"
SNAPFG_TEST_BOOT_ID=boot-A start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" durability=flush writeback=off
pio write-random "$(uri "$sock" origin)" --seed $((seed + 1)) --count 40 --max-len 262144 >/dev/null
kill9_nbdkit "$pid"
[ "$(mark "$cow")" = "SFGuboot-A" ] ||
    check_fail "after kill -9: the header lost its mark ('$(mark "$cow")')"
check_whole "kill -9, reopened with durability=sync" boot-A
v=$(header_le32 "$cow" 4)
m=$(mark "$cow")
[ "$v" = 1 ] && [ -z "$m" ] ||
    check_fail "reopened with durability=sync: header valid = $v, mark '$m' (expected 1, none)"
info "ok: reopened with durability=sync: valid = $v, no mark"
stop_nbdkit "$pid"

# ---- 4. an unclean system stop ----------------------------------------------
info "=== durability=flush: unclean system stop (kill -9, restart with another boot id)"
SNAPFG_TEST_BOOT_ID=boot-A start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" durability=flush writeback=off
pio write-random "$(uri "$sock" origin)" --seed $((seed + 2)) --count 40 --max-len 262144 >/dev/null
kill9_nbdkit "$pid"
for boot in boot-C boot-A; do
    SNAPFG_TEST_BOOT_ID=$boot start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" durability=flush writeback=off
    out=$(pio read "$(uri "$sock" snapshot)" 0 4096)
    [ "$out" = "errno EIO" ] ||
        check_fail "after an unclean stop, boot $boot: a snapshot read gave '$out', expected errno EIO"
    st=$(snapshot_status "$sock")
    [ "$st" = Invalid ] ||
        check_fail "after an unclean stop, boot $boot: snapshot status '$st', expected Invalid"
    export_equals "$(uri "$sock" origin)" "$origin" "unclean stop, boot $boot: origin export == origin file"
    if [ "$boot" = boot-C ]; then
        grep -q 'system stopped uncleanly' "$pid.log" ||
            check_fail "after an unclean stop: the log does not say the system stopped uncleanly"
    fi
    stop_nbdkit "$pid"
    v=$(header_le32 "$cow" 4)
    m=$(mark "$cow")
    [ "$v" = 0 ] && [ -z "$m" ] ||
        check_fail "after an unclean stop, boot $boot: header valid = $v, mark '$m' (expected 0, none)"
    info "ok: unclean stop, then boot $boot: Invalid (read: $out; status $st; valid = $v, no mark)"
done

# ---- bad value ----------------------------------------------------------------
if nbdkit -f -U "$tmpdir/bad.sock" "$SNAPFG_PLUGIN" origin="$origin" durability=sometimes \
       --run true >"$tmpdir/bad.out" 2>&1; then
    check_fail "durability=sometimes was accepted"
elif grep -q 'durability=sometimes' "$tmpdir/bad.out"; then
    info "ok: durability=sometimes refused: $(grep -m1 durability "$tmpdir/bad.out")"
else
    cat "$tmpdir/bad.out" >&2
    check_fail "durability=sometimes refused without naming the parameter"
fi

finish
