#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Power cuts under load.  The origin and the COW store are two exports of
# one nbdkit running the test plugin tests/nbdkit-powercut-plugin.c: disks
# with a volatile write cache (a write is durable after a flush of its
# export or with FUA) that lose power at the same instant.  snapfg reaches
# them through its libnbd backends (origin=nbd+unix:///origin?socket=...,
# cow=nbd+unix:///cow?socket=..., store=persistent).
#
# Each round: a random origin, snapfg started with a new snapshot of it;
# a client writes and zeroes the origin at random over two connections,
# 8 requests in flight, one in ten with FUA, a flush on either
# connection every 16 writes; after a random number of writes it
# pulls the plugin's trigger: the power goes, and each unflushed sector
# keeps its old contents or one of its unflushed versions (at random,
# from the printed seed).  snapfg is then killed (the machine is off),
# and the next boot starts: SNAPFG_TEST_BOOT_ID changes, the plugin
# restarts on the surviving images, snapfg restarts on it.  Then:
#   - the snapshot reads back byte for byte as the origin was when it
#     was taken (with durability=flush it may instead be Invalid, never
#     different);
#   - every origin write acknowledged with FUA, or before a flush that
#     completed was sent (on either connection), is there, and every
#     other sector holds its old contents or one of the writes made to
#     it (per 512-byte sector; powercut-io.py check).
#
# The rounds: writeback=on and writeback=off; chunk sizes 4K and 64K;
# writes of up to one chunk and of up to four (64K chunks) or sixteen
# (4K chunks); durability=flush; and a merge in progress (SNAPFG_TEST_
# MERGE_DELAY_US keeps it going) when the power goes, after which the
# merge resumes and the origin reads as the snapshot plus the writes
# made during the merge.
#
# SNAPFG_POWERCUT_VIA=files (test-powercut-files.sh) runs the same
# rounds with snapfg's file backends instead: each export of the disks
# is a regular file through nbdfuse (origin=DIR/nbd, cow=DIR/nbd), so the
# order under test is the one of pwrite, fdatasync and the committer's
# O_DIRECT copies into the COW file, and the rounds with 64K chunks and
# writeback=on check that the server did open the COW file with O_DIRECT.
#
# SNAPFG_TEST_SEED repeats a run; SNAPFG_POWERCUT_ROUNDS=N runs each
# configuration N times, each with its own seed (default 1; 4 under make
# check-soak).  To chase a failure: SNAPFG_POWERCUT_WRITEBACK=on (or off)
# runs only those rounds, and SNAPFG_POWERCUT_FLUSH_EVERY=N flushes every
# N writes instead of 16 (more flushes in flight when the power goes).
# Rounds are numbered, and seeded, in the order they run: with
# SNAPFG_POWERCUT_WRITEBACK=on and one round each, as in a full run.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/powercut-functions.sh"
require_powercut
via=${SNAPFG_POWERCUT_VIA:-nbd}
case $via in
    nbd) ;;
    files) test_name=test-powercut-files; require_disk_files ;;
    *) fail "SNAPFG_POWERCUT_VIA=$via: expected nbd or files" ;;
esac
[ -n "$SNAPFGCTL" ] && [ -x "$SNAPFGCTL" ] ||
    fail "snapfgctl not found (SNAPFGCTL='${SNAPFGCTL:-}'): run 'make tools/snapfgctl/snapfgctl' first"
test_seed

size=$((8 * 1024 * 1024))
cowsize=$((2 * size))
dsock="$tmpdir/disks.sock"
sock="$tmpdir/snapfg.sock"
pid="$tmpdir/snapfg.pid"
ctlsock="$tmpdir/ctl.sock"
oimg="$tmpdir/origin.img"
cimg="$tmpdir/cow.img"
pristine="$tmpdir/pristine.img"
repeat=${SNAPFG_POWERCUT_ROUNDS:-$(soak_or 1 4)}
flush_every=${SNAPFG_POWERCUT_FLUSH_EVERY:-16}
wbs=${SNAPFG_POWERCUT_WRITEBACK:-on off}
case $wbs in
    "on off" | on | off) ;;
    *) fail "SNAPFG_POWERCUT_WRITEBACK=$wbs: expected on or off" ;;
esac
case $flush_every in
    '' | *[!0-9]* | 0) fail "SNAPFG_POWERCUT_FLUSH_EVERY=$flush_every: expected a number of writes, 1 or more" ;;
esac
nround=0
npassed=0


# snapshot_state: the snapshot's description (nbdinfo --list), or
# "missing" if it is not listed.
snapshot_state() {
    nbdinfo --list --json "$(uri "$sock")" 2>/dev/null | "$PY" -c '
import json, sys
for e in json.load(sys.stdin)["exports"]:
    if e["export-name"] == "snapshot":
        print(e.get("description", "") or "listed")
        break
else:
    print("missing")'
}

# boot_disks [PLUGIN-ARGS...]: the disks' nbdkit on the images, and
# with SNAPFG_POWERCUT_VIA=files their exports as files.  Sets disk_o
# and disk_c, what snapfg's origin= and cow= name, and disk_o_dev, the
# device number of the origin file's file system (files only).
boot_disks() {
    start_disks "$dsock" disk=origin:"$oimg" disk=cow:"$cimg" "$@"
    if [ "$via" = files ]; then
        mount_disk_file "$tmpdir/disk-origin" "$(uri "$dsock" origin)"
        mount_disk_file "$tmpdir/disk-cow" "$(uri "$dsock" cow)"
        disk_o=$tmpdir/disk-origin/nbd disk_c=$tmpdir/disk-cow/nbd
        disk_o_dev=$(stat -c %d "$disk_o")
    else
        disk_o=$(uri "$dsock" origin) disk_c=$(uri "$dsock" cow)
    fi
}

# cow_opened_direct PID: true if process PID has the COW file open with
# O_DIRECT (the committer's gathered copies).
cow_opened_direct() {
    local fd flags
    for fd in /proc/"$1"/fd/*; do
        [ "$(readlink "$fd" 2>/dev/null)" = "$disk_c" ] || continue
        flags=$(awk '/^flags:/ {print $2}' "/proc/$1/fdinfo/${fd##*/}" 2>/dev/null) || continue
        (( (8#$flags & 8#40000) != 0 )) && return 0
    done
    return 1
}

# round NAME CHUNK MAX-LEN WRITEBACK DURABILITY MERGE
round() {
    local name=$1 chunk=$2 maxlen=$3 wb=$4 dur=$5 merge=$6
    local rseed=$((seed + nround * 7919)) after t0=$SECONDS
    local trig="$tmpdir/trigger" rep="$tmpdir/report" wlog="$tmpdir/writes.log"
    local params=() restart=() state st dev_before=
    nround=$((nround + 1))
    local what="round $nround ($name; seed $rseed)"
    info "=== $what"
    RANDOM=$rseed
    make_random_image "$oimg" "$size"
    cp "$oimg" "$pristine"
    make_zero_image "$cimg" "$cowsize"
    rm -f "$trig" "$rep" "$ctlsock"
    boot_disks seed="$rseed" trigger="$trig" report="$rep"
    params=(origin="$disk_o" cow="$disk_c"
            store=persistent chunk-size="$chunk" control="$ctlsock")
    [ "$dur" = sync ] || params+=(durability="$dur")
    params+=(writeback="$wb")
    export SNAPFG_TEST_BOOT_ID="powercut-$rseed-boot-1"
    [ "$via" != files ] || dev_before=$disk_o_dev
    if [ "$merge" = no ]; then
        start_snapfg "$sock" "$pid" "${params[@]}"
    else
        SNAPFG_TEST_MERGE_DELAY_US=20000 start_snapfg "$sock" "$pid" "${params[@]}"
    fi

    if [ "$merge" != no ]; then
        # Exceptions to merge: writes, then a flush, before the merge.
        pcio load "$(uri "$sock" origin)" --seed $((rseed + 1)) --log "$tmpdir/pre.log" \
            --max-len $((4 * chunk)) --max-writes 400 --final-flush ||
            fail "$what: writes before the merge failed"
        timeout 60 "$SNAPFGCTL" -S "$ctlsock" merge snapshot >"$tmpdir/ctl.out" 2>&1 ||
            { cat "$tmpdir/ctl.out" >&2; fail "$what: snapfgctl merge snapshot failed"; }
        info "$what: merge started"
    fi
    after=$((20 + RANDOM % 180))
    pcio load "$(uri "$sock" origin)" --seed "$rseed" --log "$wlog" \
        --max-len "$maxlen" --in-flight 8 --flush-every "$flush_every" \
        --trigger "$trig" --trigger-after "$after" ||
        check_fail "$what: the writer failed"
    wait_cut "$rep"
    info "$what: power cut after $after completed writes: $(tr '\n' ' ' <"$rep")"
    if [ "$merge" != no ]; then
        "$SNAPFGCTL" -S "$ctlsock" status snapshot >"$tmpdir/ctl.out" 2>&1 || true
        info "$what: status at the cut: $(head -c 200 "$tmpdir/ctl.out")"
    fi
    # What write-back did before the cut (where stats report it).
    timeout 10 "$SNAPFGCTL" -S "$ctlsock" stats >"$tmpdir/ctl.out" 2>&1 || true
    grep -i '^write-back' "$tmpdir/ctl.out" | sed "s/^/$test_name: $what: at the cut: /" || true
    if [ "$via" = files ] && [ "$wb" = on ] && [ "$chunk" -ge 65536 ]; then
        # Its copies are runs of 64 KiB or more: they went through O_DIRECT.
        if cow_opened_direct "$(nbdkit_pid "$pid")"; then
            info "ok: $what: the COW file was written with O_DIRECT"
        else
            check_fail "$what: the server has no O_DIRECT descriptor of the COW file $disk_c"
        fi
    fi
    # The machine is off: snapfg dies with its disks.
    kill -KILL "$(nbdkit_pid "$pid")" 2>/dev/null || true
    wait "$(nbdkit_pid "$pid")" 2>/dev/null || true
    unset "_nbdkit_pids[$pid]"
    unmount_disk_files
    kill_disks "$dsock"
    rm -f "$ctlsock" "$sock"
    # A power cut empties tmpfs: write-back's held file goes with it.
    lose_tmpfs

    # The next boot.
    boot_disks
    export SNAPFG_TEST_BOOT_ID="powercut-$rseed-boot-2"
    local fails_before=0
    [ ! -f "$tmpdir/check-failures" ] || fails_before=$(wc -l <"$tmpdir/check-failures")
    restart=("${params[@]}")
    if [ -n "$dev_before" ] && [ "$disk_o_dev" != "$dev_before" ]; then
        # Each mount of a FUSE file system gets the next free device
        # number, and a test running beside this one may have taken the
        # last one: the origin's disk came back renumbered, as a disk can
        # at a boot.  snapfg refuses that (the origin might have been
        # replaced) until it is told, as the man page says, that the
        # origin only moved.
        restart+=(origin-moved=true)
        info "$what: the origin's file system came back as device $disk_o_dev (it was $dev_before): restarting with origin-moved=true"
    fi
    if ! restart_snapfg "${restart[@]}"; then
        if grep -qE 'origin was replaced|belongs to another origin' "$pid.log"; then
            # Not what a cut does: the disks came back other than they were.
            check_fail "$what: snapfg refuses the origin after the cut: $(tail -n 1 "$pid.log")"
        elif [ "$dur" = flush ]; then
            info "ok: $what: snapfg refuses the store after the cut (allowed with durability=flush): $(tail -n 1 "$pid.log")"
        else
            check_fail "$what: snapfg does not start after the cut: $(tail -n 3 "$pid.log")"
        fi
        unmount_disk_files
        stop_disks "$dsock"
        round_result "$what" "$fails_before" "$t0"
        return 0
    fi

    if [ "$merge" = no ]; then
        state=$(snapshot_state)
        case $state in
            *Invalid*)
                if [ "$dur" = flush ]; then
                    info "ok: $what: the snapshot is Invalid after the cut (allowed with durability=flush)"
                    st=0; nbdcopy -- "$(uri "$sock" snapshot)" "$tmpdir/snap.img" 2>/dev/null || st=$?
                    [ "$st" -ne 0 ] || check_fail "$what: the snapshot says Invalid but reads"
                else
                    check_fail "$what: the snapshot is Invalid after the cut ($state)"
                fi ;;
            missing) check_fail "$what: no snapshot after the restart" ;;
            *) export_equals "$(uri "$sock" snapshot)" "$pristine" \
                   "$what: the snapshot reads back as it was taken ($state)" ;;
        esac
    fi
    if pcio check "$wlog" --base "$pristine" --uri "$(uri "$sock" origin)"; then
        info "ok: $what: the origin holds every flushed write, and old or new per sector elsewhere"
    else
        check_fail "$what: the origin after the cut is wrong"
    fi
    if [ "$merge" != no ]; then
        # The merge resumes by itself and ends; the origin stays right.
        for _ in $(seq 600); do
            [ "$(snapshot_state)" = missing ] && break
            sleep 0.1
        done
        if [ "$(snapshot_state)" = missing ]; then
            info "ok: $what: the merge resumed and finished"
            pcio check "$wlog" --base "$pristine" --uri "$(uri "$sock" origin)" ||
                check_fail "$what: the origin after the resumed merge is wrong"
        else
            check_fail "$what: the merge did not finish within 60 s of the restart ($(snapshot_state))"
        fi
    fi
    stop_nbdkit "$pid"
    unmount_disk_files
    stop_disks "$dsock"
    round_result "$what" "$fails_before" "$t0"
}

# round_result WHAT FAILURES-BEFORE T0: count the round as passed if it
# recorded no failure.
round_result() {
    local n=0
    [ ! -f "$tmpdir/check-failures" ] || n=$(wc -l <"$tmpdir/check-failures")
    if [ "$n" -eq "$2" ]; then
        npassed=$((npassed + 1))
        info "$1: passed in $((SECONDS - $3)) s"
    else
        echo "$test_name: $1 FAILED: repeat with SNAPFG_TEST_SEED=$seed" >&2
    fi
}

# restart_snapfg PARAMS...: start_snapfg after the cut, but a refusal
# to start returns 1 (the log is in $pid.log) instead of failing.
restart_snapfg() {
    local p
    rm -f "$sock" "$pid"
    nbdkit -f --exit-with-parent -U "$sock" -P "$pid" "$SNAPFG_PLUGIN" "$@" 2>"$pid.log" &
    p=$!
    for _ in $(seq 300); do
        if [ -S "$sock" ] && [ -s "$pid" ]; then
            _nbdkit_pids[$pid]=$p
            _nbdkit_logs[$pid]=$pid.log
            return 0
        fi
        if ! _proc_alive "$p"; then
            wait "$p" 2>/dev/null || true
            return 1
        fi
        sleep 0.1
    done
    fail "snapfg did not create $sock within 30 s of the restart"
}

for _ in $(seq "$repeat"); do
    for wb in $wbs; do
        round "writeback=$wb, 4K chunks, writes of one chunk" 4096 4096 "$wb" sync no
        round "writeback=$wb, 4K chunks, writes of up to 16 chunks" 4096 65536 "$wb" sync no
        round "writeback=$wb, 64K chunks, writes within one chunk" 65536 65536 "$wb" sync no
        round "writeback=$wb, 64K chunks, writes of up to 4 chunks" 65536 262144 "$wb" sync no
        round "writeback=$wb, durability=flush, 4K chunks" 4096 65536 "$wb" flush no
        round "writeback=$wb, a merge in progress, 4K chunks" 4096 16384 "$wb" sync yes
    done
done
info "$npassed of $nround rounds passed (seed $seed; disks through $via)"
finish
