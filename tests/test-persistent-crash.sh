#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Crash safety of the persistent COW store (docs/design.md section 5: COW data
# durable -> metadata durable -> origin overwritten).
#
#  1. Crash loop: several rounds of concurrent origin writers (separate
#     connections) killed with kill -9 of nbdkit at a random moment; after
#     each restart the snapshot equals the pristine image byte for byte
#     and snapfgctl inspect accepts the store.  The same COW store is kept
#     across rounds, so the exception table accumulates.  Then the same
#     with a snapshot writer alongside: the snapshot must equal the
#     pristine image plus every acknowledged snapshot write (the one in
#     flight at the kill may or may not be there).
#  2. Fault points (SNAPFG_TEST_CRASH_AT): nbdkit SIGKILLs itself after a
#     copy-out's data is written (cow-data), after the exception is
#     committed (metadata) and before an origin write (origin-write), on
#     the first or the Nth time; after a restart the snapshot equals the
#     pristine image and, with one sequential writer, the store holds
#     exactly the exceptions that were committed and the origin exactly
#     the writes that were made.
#  3. Batched copy-outs: the same fault points (and cow-run, one run of
#     a batch written) with writes of 192 and 256 chunks, each copied out
#     as one batch with one commit: with one writer the store holds
#     exactly the committed batches and the origin exactly the completed
#     writes; with four concurrent writers of 1 MiB the snapshot equals
#     the original and every acknowledged write is on the origin.
#  4. Flushed writes: four concurrent writers of 64 KiB writes flush
#     every 8 acknowledgements; nbdkit is killed with kill -9 at a random
#     moment or dies at a fault point; the snapshot equals the original
#     and every write a completed flush covered is on the origin.
#
# Sections 2 and 3 assert that every *acknowledged* write survives, which
# only writeback=off promises: they run with writeback=off.  Section 4
# runs with writeback=on, which promises the flushed writes only.
#
# Clients see their connection drop when nbdkit dies: that is expected.
set -euo pipefail
source "$(dirname "$0")/persistent-functions.sh"
require_persistent_tools

persistent_test_files
size=$((32 * 1024 * 1024))
CS=4096
rounds=${SNAPFG_CRASH_ROUNDS:-$(soak_or 3 8)}
nwriters=4
# writeback=off for the cases that check acknowledged writes,
# writeback=on for those that check flushed ones.
wb_off=(writeback=off) wb_on=(writeback=on)

# check_after_crash WHAT: restart without hooks, the snapshot must equal
# the pristine image, the origin export the origin file; inspect exits 0.
check_after_crash() {
    local what=$1 out="$tmpdir/inspect.out" st=0
    inspect "$cow" "$out" || st=$?
    if [ "$st" -ne 0 ]; then
        cat "$out" >&2
        check_fail "$what: snapfgctl inspect exited $st on the crashed store"
    else
        info "ok: $what: inspect: $(inspect_value "$out" exceptions) exceptions, status $(inspect_value "$out" status)"
    fi
    verify_crashed_store "$what" "$pristine"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    export_equals "$(uri "$sock" snapshot)" "$pristine" "$what: snapshot == pristine after restart"
    export_equals "$(uri "$sock" origin)" "$origin" "$what: origin export == origin file"
    stop_nbdkit "$pid"
}

# check_round WHAT SNAPARGS...: after a crash-loop round, restart; the
# snapshot must equal the snapshot model (pristine plus the acknowledged
# snapshot writes, which snap-model adds from the writer's log).
check_round() {
    local what=$1 out="$tmpdir/inspect.out" st=0 img="$tmpdir/snapshot-now.img"
    shift
    inspect "$cow" "$out" || st=$?
    if [ "$st" -ne 0 ]; then
        cat "$out" >&2
        check_fail "$what: snapfgctl inspect exited $st on the crashed store"
    else
        info "ok: $what: inspect: $(inspect_value "$out" exceptions) exceptions, status $(inspect_value "$out" status)"
    fi
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    if ! copy_export "$(uri "$sock" snapshot)" "$img"; then
        check_fail "$what: nbdcopy of the snapshot failed after restart"
    else
        if [ $# -gt 0 ]; then
            info "$what: $(pio snap-model "$snap_model" "$img" "$@")"
            files_equal "$img" "$snap_model" "$what: snapshot == pristine + acknowledged snapshot writes after restart"
        else
            files_equal "$img" "$snap_model" "$what: snapshot == pristine after restart"
        fi
    fi
    verify_crashed_store "$what" "$snap_model"
    export_equals "$(uri "$sock" origin)" "$origin" "$what: origin export == origin file"
    stop_nbdkit "$pid"
}

# verify_crashed_store WHAT SNAPSHOT-MODEL: the store parses as the
# documented layout (make-cow.py verify): every pair's data chunk holds
# the snapshot's data, the table ends with a zero pair, areas are zero
# past their last pair and after the current one.  (Not --dense: chunks
# allocated but not committed when the process died may stay unused.)
verify_crashed_store() {
    if make_cow verify --cow "$cow" --snapshot "$2" --chunk-size $CS \
           --origin-size "$(file_size "$origin")" >"$tmpdir/verify.out" 2>&1; then
        info "ok: $1: store layout: $(cat "$tmpdir/verify.out")"
    else
        cat "$tmpdir/verify.out" >&2
        check_fail "$1: the crashed store does not parse as the documented layout"
    fi
}

# ---- 1. crash loop ----------------------------------------------------
info "=== crash loop: $rounds rounds, $nwriters concurrent origin writers, kill -9 mid-load"
make_random_image "$origin" "$size"
cp "$origin" "$pristine"
snap_model="$tmpdir/snapshot-model.img"
cp "$origin" "$snap_model"
rm -f "$cow"
prev_exc=0
# Rounds (of the first $rounds, each on a fresh region) killed while
# chunks of their region were still to be copied out: the case this
# loop is for.  A round whose whole region was copied out before the
# kill tests only a finished copy.
mid_copy_rounds=0
region_len=$(( size / rounds / CS * CS ))
for round in $(seq $((rounds + 2))); do
    # Each round writes into its own part of the origin, at a pace that
    # leaves chunks to copy out when the kill comes; half the rounds
    # widen the copy-out window so that kills land in it.  The last two
    # rounds add a snapshot writer and go over the origin again.
    r=$(( (round - 1) % rounds ))
    region="$(( r * region_len )):$region_len"
    delay=0
    [ $((round % 2)) -eq 0 ] && delay=300
    SNAPFG_TEST_DELAY_US=$delay start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    for w in $(seq $nwriters); do
        if [ "$w" -eq $nwriters ]; then
            wopts=(--max-len 131072 --pause-ms 60)      # big multi-chunk writes
        else
            wopts=(--max-len 8192 --pause-ms 10)
        fi
        pio writer-loop "$(uri "$sock" origin)" --seed $((seed + round * 100 + w)) \
            --region "$region" --in-flight 2 "${wopts[@]}" \
            --ready-file "$tmpdir/ready-$round-$w" 2>>"$tmpdir/writers-$round.log" &
        writer_pids+=($!)
    done
    snapargs=()
    if [ "$round" -gt "$rounds" ]; then
        # Whole-chunk writes in one round, sub-chunk in the other, over
        # a region the origin writers of this round do not use (they
        # overlap with earlier rounds' copy-outs).
        sr=$(( (r + 2) % rounds ))
        snapargs=(--seed $((seed + round)) --chunk-size $CS
                  --chunks "$(( sr * region_len / CS ))-$(( (sr + 1) * region_len / CS - 1 ))"
                  --log "$tmpdir/snap-writes-$round.log")
        [ "$round" -eq $((rounds + 2)) ] && snapargs+=(--piece 1024:1536)
        pio snap-writer "$(uri "$sock" snapshot)" "${snapargs[@]}" \
            2>>"$tmpdir/writers-$round.log" &
        writer_pids+=($!)
    fi
    # The clock starts when every writer has had a reply (a loaded
    # machine may take a while to start them).
    for i in $(seq 300); do
        [ "$(ls "$tmpdir" | grep -c "^ready-$round-")" -eq $nwriters ] && break
        sleep 0.1
    done
    [ "$(ls "$tmpdir" | grep -c "^ready-$round-")" -eq $nwriters ] ||
        fail "round $round: the writers did not get going within 30 s"
    ms=$((500 + RANDOM % 2501))
    sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
    npid=$(nbdkit_pid "$pid")
    _proc_alive "$npid" || fail "round $round: nbdkit died by itself under load"
    kill9_nbdkit "$pid"
    kill_writers
    info "round $round: killed nbdkit after ${ms} ms of writes to $region (copy-out delay ${delay} us)${snapargs:+, with a snapshot writer}"
    check_round "crash round $round" "${snapargs[@]}"
    exc=$(inspect_value "$tmpdir/inspect.out" exceptions)
    if [ -n "$exc" ] && [ "$exc" -gt "$prev_exc" ]; then
        info "round $round: $((exc - prev_exc)) new exceptions (region of $((region_len / CS)) chunks)"
        if [ "$round" -le "$rounds" ]; then
            if [ "$exc" -ge $(( prev_exc + region_len / CS )) ]; then
                info "round $round: every chunk of the region was copied out before the kill (not a mid copy-out crash)"
            else
                mid_copy_rounds=$((mid_copy_rounds + 1))
            fi
        fi
    else
        cat "$tmpdir/writers-$round.log" >&2
        check_fail "round $round: no exception was added (did the writers run?)"
    fi
    prev_exc=${exc:-0}
done
if [ "$mid_copy_rounds" -eq 0 ]; then
    skip_part "crash loop: in none of the $rounds rounds did the kill come while chunks were still to be copied out (the writers were too slow here): a crash in mid copy-out was not exercised"
else
    info "crash loop: $mid_copy_rounds of $rounds rounds were killed in mid copy-out"
fi
# The rounds must have actually written something.
out="$tmpdir/inspect.out"
inspect "$cow" "$out" || true
n=$(inspect_value "$out" exceptions)
[ -n "$n" ] && [ "$n" -gt 0 ] ||
    check_fail "crash loop: the store holds no exception after $rounds rounds of writes"
info "crash loop: $n exceptions accumulated"

# ---- 2. fault points --------------------------------------------------
fsize=$((8 * 1024 * 1024))

# fault_case SPEC N WRITERS: crash at SPEC; with one writer, N is the
# count in the spec (1 if none).
fault_case() {
    local spec=$1 n=$2 writers=$3 st completed out="$tmpdir/drive.out" exc
    info "=== fault point $spec ($writers writer(s))"
    make_random_image "$origin" "$fsize"
    cp "$origin" "$pristine"
    rm -f "$cow"
    SNAPFG_TEST_CRASH_AT=$spec start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" "${wb_off[@]}"
    if [ "$writers" -eq 1 ]; then
        # Whole-chunk writes to chunks 0, 1, 2, ...: write k (from 1)
        # needs exactly one copy-out, of chunk k-1.
        pio drive-until-death "$(uri "$sock" origin)" --chunk-size $CS --max 2000 \
            >"$out" 2>"$tmpdir/drive.err" || true
        completed=$(sed -n 's/^completed \([0-9]*\)$/\1/p' "$out")
    else
        for w in $(seq "$writers"); do
            pio writer-loop "$(uri "$sock" origin)" --seed $((seed + w)) \
                --max-len 65536 --in-flight 4 2>>"$tmpdir/writers.log" &
            writer_pids+=($!)
        done
    fi
    wait_nbdkit_death "$pid" 30
    st=$nbdkit_status
    kill_writers
    case $st in
        137) info "ok: $spec: nbdkit died by SIGKILL" ;;
        alive) kill9_nbdkit "$pid"
               check_fail "$spec: nbdkit never reached the fault point (still running)"
               return ;;
        *) check_fail "$spec: nbdkit exited with status $st, expected 137 (SIGKILL)" ;;
    esac
    if [ "$writers" -eq 1 ]; then
        if [ -z "$completed" ]; then
            cat "$out" "$tmpdir/drive.err" >&2
            check_fail "$spec: the writer did not see the server die"
        else
            # The write that hit the fault point got no reply.
            [ "$completed" -eq $((n - 1)) ] ||
                check_fail "$spec: $completed writes completed before the crash, expected $((n - 1))"
            # Exceptions that must be on disk: cow-data dies before the
            # Nth commit, metadata and origin-write after it.
            case $spec in
                cow-data*) exc=$((n - 1)) ;;
                *) exc=$n ;;
            esac
            check_inspect "$cow" "$exc" "$spec: committed exceptions after the crash"
            # The origin holds exactly the first n-1 writes: chunks
            # 0..n-2 changed, chunk n-1 (whose write died) and the rest
            # are still pristine.
            "$PY" - "$origin" "$pristine" $CS $((n - 1)) <<'PYEOF' ||
import sys
a = open(sys.argv[1], "rb").read()
b = open(sys.argv[2], "rb").read()
cs, done = int(sys.argv[3]), int(sys.argv[4])
unwritten = [c for c in range(done) if a[c*cs:(c+1)*cs] == b[c*cs:(c+1)*cs]]
if unwritten:
    sys.exit("completed writes missing from the origin: chunks %s" % unwritten[:10])
if a[done*cs:] != b[done*cs:]:
    first = next(c for c in range(done, len(a) // cs)
                 if a[c*cs:(c+1)*cs] != b[c*cs:(c+1)*cs])
    sys.exit("origin chunk %d changed, but no completed write touched it" % first)
PYEOF
                check_fail "$spec: the origin does not hold exactly the $((n - 1)) completed writes"
        fi
    fi
    check_after_crash "fault $spec"
}

fault_case cow-data 1 1
fault_case metadata 1 1
fault_case origin-write 1 1
fault_case cow-data:5 5 1
fault_case metadata:5 5 1
fault_case origin-write:5 5 1
# Concurrent writers: group commits in flight when the process dies.
fault_case cow-data:40 40 4
fault_case metadata:40 40 4
fault_case origin-write:60 60 4

# ---- 3. batched copy-outs: multi-chunk writes -------------------------
# A write over many fresh chunks copies them out as one batch: one run
# of consecutive COW chunks per stretch the store's allocation allows,
# one commit for the batch.  768 KiB writes over 4K chunks are 192
# chunks each; the store's regions hold 256 data chunks, so the 2nd and
# 3rd batches are two runs each (cow-run: one run written, the batch
# not committed).

# batch_fault_case SPEC N EXPECTED-EXCEPTIONS: one writer, 768 KiB writes
# at 0, 768K, 1536K, ...; it dies at the Nth fault; the writes before the
# dying one completed and the store holds EXPECTED-EXCEPTIONS.
bws=$((768 * 1024))
batch_fault_case() {
    local spec=$1 n=$2 exc=$3 st completed out="$tmpdir/drive.out"
    info "=== batched copy-outs: fault point $spec, ${bws}-byte writes"
    make_random_image "$origin" "$fsize"
    cp "$origin" "$pristine"
    rm -f "$cow"
    SNAPFG_TEST_CRASH_AT=$spec start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" "${wb_off[@]}"
    pio drive-until-death "$(uri "$sock" origin)" --chunk-size $CS --write-size $bws \
        --max $((fsize / bws)) >"$out" 2>"$tmpdir/drive.err" || true
    completed=$(sed -n 's/^completed \([0-9]*\)$/\1/p' "$out")
    wait_nbdkit_death "$pid" 30
    st=$nbdkit_status
    case $st in
        137) info "ok: $spec: nbdkit died by SIGKILL" ;;
        alive) kill9_nbdkit "$pid"
               check_fail "$spec (batched): nbdkit never reached the fault point (still running)"
               return ;;
        *) check_fail "$spec (batched): nbdkit exited with status $st, expected 137 (SIGKILL)" ;;
    esac
    if [ -z "$completed" ]; then
        cat "$out" "$tmpdir/drive.err" >&2
        check_fail "$spec (batched): the writer did not see the server die"
        return
    fi
    [ "$completed" -eq $((n - 1)) ] ||
        check_fail "$spec (batched): $completed writes completed before the crash, expected $((n - 1))"
    check_inspect "$cow" "$exc" "$spec (batched): committed exceptions after the crash"
    # The origin holds exactly the completed writes (in units of one write).
    "$PY" - "$origin" "$pristine" $bws $((n - 1)) <<'PYEOF' ||
import sys
a = open(sys.argv[1], "rb").read()
b = open(sys.argv[2], "rb").read()
ws, done = int(sys.argv[3]), int(sys.argv[4])
unwritten = [w for w in range(done) if a[w*ws:(w+1)*ws] == b[w*ws:(w+1)*ws]]
if unwritten:
    sys.exit("completed writes missing from the origin: writes %s" % unwritten[:10])
if a[done*ws:] != b[done*ws:]:
    sys.exit("the origin changed past the completed writes")
PYEOF
        check_fail "$spec (batched): the origin does not hold exactly the $((n - 1)) completed writes"
    check_after_crash "batched fault $spec"
}

per=$((bws / CS))
batch_fault_case cow-data 1 0
batch_fault_case metadata 1 $per
batch_fault_case origin-write 1 $per
batch_fault_case cow-data:3 3 $((2 * per))
batch_fault_case metadata:3 3 $((3 * per))
batch_fault_case origin-write:3 3 $((3 * per))
# Run 2 is the first of write 2's two runs (COW chunks 194-257, then
# 259-386 after metadata area 1): a third of the batch written.
batch_fault_case cow-run:2 2 $per

# check_acked OK-WHAT FAIL-WHAT WRITE-SIZE SEED0 LOG-PREFIX: every write
# seq-writer w (0-3: seed SEED0+w, log LOG-PREFIXw) logged as acknowledged
# is on the origin file.  One check-acked run checks the four writers
# (a Python start each cost more than the check); its line per writer
# is reported as the writer's own check.
check_acked() {
    local ok=$1 bad=$2 ws=$3 seed0=$4 prefix=$5 w args=() out st=0 line n=0
    for w in 0 1 2 3; do
        touch "$prefix$w"
        args+=(--seed $((seed0 + w)) --log "$prefix$w")
    done
    out=$(pio check-acked "$origin" --write-size "$ws" "${args[@]}" 2>&1) || st=$?
    while IFS= read -r line; do
        case $line in
            "writer "[0-3]": ok: "*) info "ok: $ok: ${line/: ok: /: }"; n=$((n + 1)) ;;
            "writer "[0-3]": MISSING: "*) check_fail "$bad: ${line/: MISSING: /: }"; n=$((n + 1)) ;;
        esac
    done <<<"$out"
    if [ "$n" -ne 4 ] || { [ "$st" -ne 0 ] && [[ "$out" != *": MISSING: "* ]]; }; then
        check_fail "$bad: check-acked exited $st with $n writer lines, not 4: $out"
    fi
}

# Concurrent 1 MiB writers, each over its own region, 4 in flight:
# batches of several connections in the same group commits when the
# process dies.  The snapshot equals the original; every acknowledged
# write is on the origin.
batch_concurrent_case() {
    local spec=$1 st w region_len=$((bsize / 4)) ws=$((1024 * 1024))
    info "=== batched copy-outs: fault point $spec, 4 writers of 1 MiB writes"
    make_random_image "$origin" "$bsize"
    cp "$origin" "$pristine"
    rm -f "$cow" "$tmpdir"/acked-*
    SNAPFG_TEST_CRASH_AT=$spec start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" "${wb_off[@]}"
    for w in 0 1 2 3; do
        pio seq-writer "$(uri "$sock" origin)" --seed $((seed + w)) --write-size $ws \
            --in-flight 4 --region "$((w * region_len)):$region_len" \
            --log "$tmpdir/acked-$w" 2>>"$tmpdir/writers.log" &
        writer_pids+=($!)
    done
    wait_nbdkit_death "$pid" 60
    st=$nbdkit_status
    kill_writers
    case $st in
        137) info "ok: $spec: nbdkit died by SIGKILL" ;;
        alive) kill9_nbdkit "$pid"
               check_fail "$spec (batched, 4 writers): nbdkit never reached the fault point"
               return ;;
        *) check_fail "$spec (batched, 4 writers): nbdkit exited with status $st, expected 137" ;;
    esac
    check_acked "$spec" "$spec (batched, 4 writers)" $ws $seed "$tmpdir/acked-"
    check_after_crash "batched fault $spec, 4 writers"
}

bsize=$((32 * 1024 * 1024))
batch_concurrent_case cow-data:12
batch_concurrent_case cow-run:12
batch_concurrent_case metadata:12
batch_concurrent_case origin-write:16

# ---- 4. flushed writes, writeback=on ----------------------------------
# flushed_case SPEC: SPEC is a fault point, or "random" (kill -9 after
# 0.05-0.4 s of writes).  Four writers over their own quarters, 64 KiB
# writes, 4 in flight, a flush after every 8 acknowledgements; their
# logs hold only the flushed writes, which must all be on the origin.
flushed_case() {
    local spec=$1 st w region_len ws=65536 fsz=$((32 * 1024 * 1024)) ms
    region_len=$((fsz / 4))
    info "=== flushed writes survive ($spec, ${wb_on[*]})"
    make_random_image "$origin" "$fsz"
    cp "$origin" "$pristine"
    rm -f "$cow" "$tmpdir"/flushed-* "$tmpdir"/ready-f-*
    if [ "$spec" = random ]; then
        start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" "${wb_on[@]}"
    else
        SNAPFG_TEST_CRASH_AT=$spec start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" "${wb_on[@]}"
    fi
    for w in 0 1 2 3; do
        pio seq-writer "$(uri "$sock" origin)" --seed $((seed + 40 + w)) --write-size $ws \
            --in-flight 4 --flush-every 8 --region "$((w * region_len)):$region_len" \
            --log "$tmpdir/flushed-$w" --ready-file "$tmpdir/ready-f-$w" \
            2>>"$tmpdir/writers.log" &
        writer_pids+=($!)
    done
    if [ "$spec" = random ]; then
        for _ in $(seq 300); do
            [ "$(ls "$tmpdir" | grep -c '^ready-f-')" -eq 4 ] && break
            sleep 0.1
        done
        ms=$((50 + RANDOM % 351))
        sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
        _proc_alive "$(nbdkit_pid "$pid")" || fail "$spec: nbdkit died by itself under load"
        kill9_nbdkit "$pid"
        info "killed nbdkit (kill -9) after ${ms} ms of writes"
    else
        wait_nbdkit_death "$pid" 60
        st=$nbdkit_status
        case $st in
            137) info "ok: $spec: nbdkit died by SIGKILL" ;;
            alive) kill9_nbdkit "$pid"
                   check_fail "$spec (flushed writes): nbdkit never reached the fault point" ;;
            *) check_fail "$spec (flushed writes): nbdkit exited with status $st, expected 137" ;;
        esac
    fi
    kill_writers
    check_acked "$spec: flushed" "$spec (flushed writes)" $ws $((seed + 40)) "$tmpdir/flushed-"
    check_after_crash "flushed writes, $spec"
}

flushed_case random
flushed_case random
flushed_case cow-data:150
# Write-back commits in rounds as large as its queue: few commits.
flushed_case metadata:8
flushed_case origin-write:200

finish
