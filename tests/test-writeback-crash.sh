#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A crash of the server loses no acknowledged write, with writeback=on
# (the default) as with writeback=off (docs/design.md section 5: held
# writes live in a file on tmpfs and are replayed at the next start).
#
# Each round: a persistent snapshot with durability=sync (so that first
# writes are held), three connections writing, zeroing and trimming 1 to
# 16 chunks (and pieces of one) at random, overlapping places of their
# regions, 8 in flight each; then nbdkit dies by SIGKILL (or SIGSEGV,
# SIGABRT) with no flush.  Some rounds pause the committer first
# (SNAPFG_TEST_WRITEBACK_PAUSE), so that thousands of writes are held and
# none has reached the origin when the process dies; one round has a
# checkpoint tracking, one a merge running.  After each round the server
# is started again on the same files; it must log the replay, and then:
#   - every acknowledged request is on the origin (tests/held-io.py
#     check: for each sector, what the last acknowledged request over it
#     left, or what one in flight at the death would have);
#   - the snapshot still reads the original image;
#   - the held file is gone after a clean stop.
# The same loop runs with writeback=off (fewer rounds).
set -euo pipefail
source "$(dirname "$0")/persistent-functions.sh"
require_persistent_tools

persistent_test_files
HIO="$top_srcdir/tests/held-io.py"
size=$((32 * 1024 * 1024))
CS=4096
nwriters=3
# The writers share the first three quarters; the merge round writes the
# last quarter before its merge.
region_len=$((size / 4 / CS * CS))
make_random_image "$origin" "$size"
cp "$origin" "$pristine"

hio() { "$PY" "$HIO" "$@"; }

# held_files: how many held files are in the held directory now.
held_files() { find "$held_dir" -maxdepth 1 -name 'snapfg-held-*' | wc -l; }

# crash_round NAME SIGNAL PAUSE WB EXTRA...: one round as above.
crash_round() {
    local name=$1 sig=$2 pause=$3 wb=$4 st ms n logs=() args=()
    shift 4
    local pausefile="$tmpdir/pause"
    rm -f "$tmpdir"/log-* "$tmpdir"/ready-*
    if [ "$pause" = pause ]; then
        touch "$pausefile"
        SNAPFG_TEST_WRITEBACK_PAUSE="$pausefile" \
            start_snapfg "$sock" "$pid" origin="$origin" ${cow:+cow="$cow"} \
            writeback="$wb" control="$ctlsock" "$@"
    else
        start_snapfg "$sock" "$pid" origin="$origin" ${cow:+cow="$cow"} \
            writeback="$wb" control="$ctlsock" "$@"
    fi
    # A round's set-up once the server runs (the merge round's).
    [ -z "${PREP:-}" ] || "$PREP"
    for w in $(seq $nwriters); do
        hio writer "$(uri "$sock" origin)" --seed $((seed + w)) \
            --log "$tmpdir/log-$w" --region "$(( (w - 1) * region_len )):$region_len" \
            --in-flight 8 --ready-file "$tmpdir/ready-$w" \
            2>>"$tmpdir/writers.log" &
        writer_pids+=($!)
        logs+=(--seed $((seed + w)) --log "$tmpdir/log-$w")
    done
    for _ in $(seq 300); do
        [ "$(ls "$tmpdir" | grep -c '^ready-')" -eq $nwriters ] && break
        sleep 0.1
    done
    [ "$(ls "$tmpdir" | grep -c '^ready-')" -eq $nwriters ] ||
        fail "$name: the writers did not get going within 30 s"
    ms=$((300 + RANDOM % 1200))
    sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
    n=$(cat "$tmpdir"/log-* | grep -c '^A ' || true)
    kill -"$sig" "$(nbdkit_pid "$pid")"
    wait_nbdkit_death "$pid" 30
    st=$nbdkit_status
    kill_writers
    [ "$st" != alive ] || fail "$name: nbdkit survived SIG$sig"
    info "$name: nbdkit died by SIG$sig (status $st) after ${ms} ms, $n requests acknowledged${pause:+ ($pause)}"
    [ "$n" -gt 0 ] || check_fail "$name: no request was acknowledged before the death"
    rm -f "$pausefile"

    # The restart replays what was held.
    if [ "$wb" = on ]; then
        [ "$(held_files)" -eq 1 ] ||
            check_fail "$name: expected the held file after the crash, found $(held_files)"
    fi
    start_snapfg "$sock" "$pid" origin="$origin" ${cow:+cow="$cow"} writeback="$wb" \
        control="$ctlsock" "$@"
    [ -z "${AFTER:-}" ] || "$AFTER"
    if [ "$wb" = on ]; then
        if grep -q "replayed [0-9]* held write" "$pid.log"; then
            info "$name: $(grep -o 'replayed [0-9]* held writes\? ([0-9]* bytes)' "$pid.log")"
        elif grep -q "with no write to replay: removed" "$pid.log"; then
            info "$name: nothing was held at the crash (the held file was removed)"
        else
            check_fail "$name: the restart did not log a replay"
        fi
    fi
    [ -z "$cow" ] ||
        export_equals "$(uri "$sock" snapshot)" "$pristine" "$name: snapshot == the original"
    stop_nbdkit "$pid"
    [ "$(held_files)" -eq 0 ] ||
        check_fail "$name: a held file is left after a clean stop"
    if out=$(hio check "$origin" "$pristine" "${logs[@]}" ${UNTOUCHED:+--untouched} 2>&1); then
        info "ok: $name: $out"
    else
        check_fail "$name: $out"
    fi
    # The next round starts from here.
    cp "$origin" "$pristine.round"
}

# Each round's snapshot is new: the store is made again, and the
# checker's "pristine" is the origin before the round.
next_round() {
    rm -f "$cow" "$tmpdir/state.json"
    cp "$origin" "$pristine"
}

round=0
for spec in "KILL pause" "KILL -" "SEGV pause" "ABRT -" "KILL pause" "KILL -"; do
    set -- $spec
    round=$((round + 1))
    next_round
    crash_round "writeback=on round $round" "$1" "${2#-}" on
done

# A checkpoint tracking (state=, a checkpoint created before the writes).
next_round
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" control="$ctlsock" state="$tmpdir/state.json"
"$SNAPFGCTL" -S "$ctlsock" checkpoint create cp1 >/dev/null ||
    fail "cannot create a checkpoint"
stop_nbdkit "$pid"
crash_round "writeback=on, a checkpoint tracking" KILL pause on state="$tmpdir/state.json"

# A merge running: snapshot s1 (the origin's only one) gets exceptions
# from writes to the last quarter, then its merge starts, slowed down,
# and the writers write the first three quarters while it runs and when
# nbdkit dies.  After the restart the merge resumes and ends: the last
# quarter is s1's again, the rest holds every acknowledged request.
merge_prep() {
    "$SNAPFGCTL" -S "$ctlsock" create s1 --cow "$tmpdir/s1.cow" >/dev/null ||
        fail "merge round: cannot create s1"
    "$PY" - "$(uri "$sock" origin)" $((3 * region_len)) $((size - 3 * region_len)) <<'PYEOF' ||
import sys, os, nbd
h = nbd.NBD(); h.connect_uri(sys.argv[1])
off, n = int(sys.argv[2]), int(sys.argv[3])
for at in range(off, off + n, 65536):
    h.pwrite(os.urandom(65536), at)
h.flush()
h.shutdown()
PYEOF
        fail "merge round: cannot write the last quarter"
    "$SNAPFGCTL" -S "$ctlsock" merge s1 >/dev/null || fail "merge round: cannot start the merge"
}
merge_wait() {
    for _ in $(seq 600); do
        "$SNAPFGCTL" -S "$ctlsock" --json list 2>/dev/null | grep -q '"s1"' || return 0
        sleep 0.1
    done
    check_fail "merge round: the merge did not end within 60 s of the restart"
}
next_round
saved_cow=$cow
cow=
export SNAPFG_TEST_MERGE_DELAY_US=2000
PREP=merge_prep AFTER=merge_wait UNTOUCHED=1 \
    crash_round "writeback=on, a merge running" KILL "" on state="$tmpdir/state.json"
unset SNAPFG_TEST_MERGE_DELAY_US
cow=$saved_cow

# writeback=off: the same promise, without a held file.
for r in 1 2; do
    next_round
    crash_round "writeback=off round $r" KILL "" off
    [ "$(held_files)" -eq 0 ] || check_fail "writeback=off made a held file"
done

finish
