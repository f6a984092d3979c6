#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup after crashes and failures:
#
# A. kill -9 of the server between a run's checkpoint creation and the
#    next run, then a restart with the same state=: the next incremental
#    is still exact.
# B. A simulated unclean system stop (kill -9, then a restart with
#    another boot id, SNAPFG_TEST_BOOT_ID): the incremental is refused
#    (exit 3, "full backup"), nothing is recorded; --full then works, and
#    the incremental after it is exact.
# C. The tool killed (-9) midway through a copy: the chain recorded so
#    far restores as before, and the next run is a correct incremental
#    that removes the leftovers (image, snapshot, checkpoint).
# D. The tool stopped midway by SIGTERM: it cleans up itself (no image,
#    no snapshot), keeps the older checkpoint; the next run is correct.
# E. The source failing (nbdkit's error filter on reads): exit 1, nothing
#    recorded, snapshot dropped; once the errors stop the next run is
#    correct.
# F. A crash after the manifest is durable but before the image's rename:
#    restore reads the .partial the manifest vouches for, and the next
#    run finishes the rename.

set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools

size=$((32 * 1024 * 1024))
disk="$tmpdir/disk.img"
sock="$tmpdir/sock"
ctl="$tmpdir/ctl"
pidf="$tmpdir/nbdkit.pid"
dir="$tmpdir/backups"
state="$tmpdir/disk.state"
make_random_image "$disk" "$size"
origin=$(uri "$sock")

# start BOOT_ID [PARAMS]: the server, with a simulated boot id.
start() {
    local boot=$1
    shift
    # writeback=off: acknowledged writes survive a kill -9.
    SNAPFG_TEST_BOOT_ID=$boot start_snapfg "$sock" "$pidf" origin="$disk" \
        state="$state" control="$ctl" writeback=off "$@"
}
kill9() {
    kill -KILL "$(nbdkit_pid "$pidf")"
    wait_nbdkit_death "$pidf" 60
    [ "$nbdkit_status" != alive ] || fail "nbdkit survived kill -9"
}

# write_some N SEED: N acknowledged random writes to the origin (no flush).
write_some() { write_random_blocks "$origin" "$1" "$2" "$size"; }

# run_ok N WHAT [ARGS]: a backup that must succeed and restore exactly.
run_ok() {
    local n=$1 what=$2 st=0
    shift 2
    save_origin "$origin" "$tmpdir/expect-$n.img"
    bk -S "$ctl" -u "$origin" backup "$dir" "$@" || st=$?
    if [ "$st" -ne 0 ]; then
        cat "$tmpdir/bk.log" >&2
        fail "$what: backup exited $st"
    fi
    [ "$(manifest_field "$dir" "$n" seq)" = "$n" ] || fail "$what: run $n not recorded"
    restore_equals "$dir" "$n" "$tmpdir/expect-$n.img" "$what"
}

runs() { "$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["runs"]))' "$dir/manifest.json"; }

start boot-A
require_checkpoints "$ctl"
run_ok 1 "full backup"

# --- A: kill -9 between checkpoint creation and the next run ------------
write_some 100 1
kill9
start boot-A
write_some 50 2
run_ok 2 "incremental after kill -9 of the server"
[ "$(manifest_field "$dir" 2 type)" = incremental ] || check_fail "run 2 was not incremental"

# --- B: unclean system stop ---------------------------------------------
write_some 100 3
kill9
start boot-B
save_origin "$origin" "$tmpdir/expect-3.img"
st=0; bk -S "$ctl" -u "$origin" backup "$dir" || st=$?
if [ "$st" -eq 3 ] && grep -qi 'full backup\|--full' "$tmpdir/bk.log"; then
    info "ok: incremental refused after an unclean stop: $(tail -n 1 "$tmpdir/bk.log")"
else
    cat "$tmpdir/bk.log" >&2
    check_fail "incremental after an unclean stop: exit $st, expected 3 with a full-backup message"
fi
[ "$(runs)" -eq 2 ] || check_fail "the refused run was recorded"
[ -z "$(our_snapshots "$ctl")" ] || check_fail "the refused run left a snapshot"
run_ok 3 "--full after the unclean stop" --full
[ "$(manifest_field "$dir" 3 type)" = full ] || check_fail "run 3 was not full"
write_some 60 4
run_ok 4 "incremental after the new full"
[ "$(manifest_field "$dir" 4 type)" = incremental ] || check_fail "run 4 was not incremental"
restore_equals "$dir" 2 "$tmpdir/expect-2.img" "run 2 still restores after the new chain"

# --- C: the tool killed midway ------------------------------------------
write_some 300 5
SNAPFG_BACKUP_TEST_STOP_AFTER=$((1024 * 1024)) \
    "$SNAPFG_BACKUP" -S "$ctl" -u "$origin" backup "$dir" >"$tmpdir/bk-c.log" 2>&1 &
bpid=$!
stopped=no
for _ in $(seq 600); do
    if [ "$(awk '{print $3}' "/proc/$bpid/stat" 2>/dev/null)" = T ]; then
        stopped=yes; break
    fi
    sleep 0.1
done
[ "$stopped" = yes ] || { cat "$tmpdir/bk-c.log" >&2; fail "the backup did not stop midway"; }
ls "$dir"/0005-incr.qcow2.partial >/dev/null || check_fail "no partial image while the run was stopped"
[ -n "$(our_snapshots "$ctl")" ] || check_fail "no snapshot while the run was stopped"
kill -KILL "$bpid"
wait "$bpid" 2>/dev/null || true
[ "$(runs)" -eq 4 ] || check_fail "the killed run was recorded"
restore_equals "$dir" 4 "$tmpdir/expect-4.img" "run 4 restores after a killed run"
write_some 40 6
run_ok 5 "incremental after a killed run"
[ "$(manifest_field "$dir" 5 type)" = incremental ] || check_fail "run 5 was not incremental"
ls "$dir" | grep -q partial && check_fail "leftovers in $dir: $(ls "$dir")"
[ -z "$(our_snapshots "$ctl")" ] || check_fail "leftover snapshot: $(our_snapshots "$ctl")"
[ "$(our_checkpoints "$ctl" | sort)" = "$(chain_checkpoints "$dir")" ] ||
    check_fail "checkpoints after run 5: $(our_checkpoints "$ctl" | tr '\n' ' ')"

# --- D: SIGTERM midway ----------------------------------------------------
write_some 300 7
SNAPFG_BACKUP_TEST_STOP_AFTER=$((1024 * 1024)) \
    "$SNAPFG_BACKUP" -S "$ctl" -u "$origin" backup "$dir" >"$tmpdir/bk-d.log" 2>&1 &
bpid=$!
for _ in $(seq 600); do
    [ "$(awk '{print $3}' "/proc/$bpid/stat" 2>/dev/null)" = T ] && break
    sleep 0.1
done
kill -TERM "$bpid"; kill -CONT "$bpid"
st=0; wait "$bpid" || st=$?
[ "$st" -eq 1 ] || { cat "$tmpdir/bk-d.log" >&2; check_fail "SIGTERM midway: exit $st, expected 1"; }
[ "$(runs)" -eq 5 ] || check_fail "the stopped run was recorded"
ls "$dir" | grep -q partial && check_fail "the stopped run left $(ls "$dir")"
[ -z "$(our_snapshots "$ctl")" ] || check_fail "the stopped run left its snapshot"
[ "$(our_checkpoints "$ctl" | sort)" = "$(chain_checkpoints "$dir")" ] ||
    check_fail "after the stopped run the checkpoints are $(our_checkpoints "$ctl" | tr '\n' ' '), expected run 5's and the full's"
run_ok 6 "incremental after a stopped run"

# --- E: the source fails ----------------------------------------------
stop_nbdkit "$pidf"
NBDKIT_OPTS=--filter=error start boot-B \
    error-pread-rate=100% error=EIO error-file="$tmpdir/inject"
write_some 80 8
touch "$tmpdir/inject"
st=0; bk -S "$ctl" -u "$origin" backup "$dir" || st=$?
rm -f "$tmpdir/inject"
if [ "$st" -eq 1 ] && grep -q 'failed' "$tmpdir/bk.log"; then
    info "ok: failing source: $(grep failed "$tmpdir/bk.log" | head -n 1)"
else
    cat "$tmpdir/bk.log" >&2
    check_fail "failing source: exit $st, expected 1 with a message"
fi
[ "$(runs)" -eq 6 ] || check_fail "the failed run was recorded"
ls "$dir" | grep -q partial && check_fail "the failed run left $(ls "$dir")"
[ -z "$(our_snapshots "$ctl")" ] || check_fail "the failed run left its snapshot"
[ "$(our_checkpoints "$ctl" | sort)" = "$(chain_checkpoints "$dir")" ] ||
    check_fail "after the failed run the checkpoints are $(our_checkpoints "$ctl" | tr '\n' ' '), expected run 6's and the full's"
restore_equals "$dir" 6 "$tmpdir/expect-6.img" "run 6 restores after a failed run"
write_some 30 9
run_ok 7 "incremental after a failed run"
[ "$(manifest_field "$dir" 7 type)" = incremental ] || check_fail "run 7 was not incremental"

# --- F: a crash between the durable manifest and the rename -------------
# (the manifest names 0007-incr.qcow2, only its .partial exists)
mv "$dir/0007-incr.qcow2" "$dir/0007-incr.qcow2.partial"
restore_equals "$dir" 7 "$tmpdir/expect-7.img" "restore of a run whose rename was cut short"
write_some 30 10
run_ok 8 "incremental after a rename cut short"
[ -f "$dir/0007-incr.qcow2" ] && [ ! -e "$dir/0007-incr.qcow2.partial" ] ||
    check_fail "the cut-short rename was not finished: $(ls "$dir")"
restore_equals "$dir" 7 "$tmpdir/expect-7.img" "run 7 after finishing its rename"

stop_nbdkit "$pidf"
finish
