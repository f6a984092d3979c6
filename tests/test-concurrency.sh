#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Races between origin writes (copy-outs) and snapshot reads: writer
# threads write random ranges of the origin while reader threads read
# the snapshot and compare every byte with the original image, each on
# its own connection, crowding on the chunks being copied.  With
# SNAPFG_TEST_DELAY_US the engine sleeps inside the race windows.  Each
# configuration runs in rounds; every round restarts nbdkit, so a fresh
# snapshot has uncopied chunks to race on.  After every round the origin
# file must equal the driver's model.
#
# SNAPFG_CONCURRENCY_SECONDS (default 10, 4 under a sanitizer) sets the length of each
# configuration.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg
require_nbd_check

size=$((16 * 1024 * 1024))
# Under a sanitizer every operation is 5-15 times slower and each is
# checked as it runs (ThreadSanitizer needs no collision to see a race):
# 4 s a configuration there.
total=${SNAPFG_CONCURRENCY_SECONDS:-$([ -n "${SNAPFG_SANITIZER:-}" ] && echo 4 || echo 10)}
test_files "$size"

# run_config NAME DELAY_US SECONDS WRITERS READERS "DRIVER OPTIONS" PARAMS...
run_config() {
    local name=$1 delay=$2 secs=$3 writers=$4 readers=$5 dopts=$6
    local rounds round per t0=$SECONDS
    shift 6
    rounds=$(( secs >= 6 ? secs / 3 : 1 ))
    per=$(( (secs + rounds - 1) / rounds ))
    info "=== $name: $rounds round(s) of $per s, $writers writers, $readers readers, delay ${delay:-none} us, params: $*"
    for round in $(seq "$rounds"); do
        # The snapshot is taken at start-up: the original for this round
        # is the origin as the previous round left it.
        cp "$origin" "$orig"
        rm -f "$cow" "$expected"
        if [ -n "$delay" ]; then
            SNAPFG_TEST_DELAY_US=$delay start_snapfg "$sock" "$pid" \
                origin="$origin" cow="$cow" store=transient "$@"
        else
            start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" store=transient "$@"
        fi
        # shellcheck disable=SC2086
        timeout $((per + 120)) "$NBD_CHECK" concurrency $dopts \
            --seed $((seed + round)) --expect-origin "$expected" \
            "$(uri "$sock" origin)" "$(uri "$sock" snapshot)" "$orig" \
            "$per" "$writers" "$readers" ||
            fail "$name, round $round: nbd-check concurrency failed (seed $((seed + round)))"
        stop_nbdkit "$pid"
        cmp "$origin" "$expected" ||
            fail "$name, round $round: origin file differs from the expected contents"
        [ "$(file_size "$cow")" -eq 0 ] ||
            fail "$name, round $round: transient COW file not truncated on exit"
    done
    info "$name: passed in $((SECONDS - t0)) s"
}

test_seed

run_config "striped, delayed" 200 "$total" 4 4 "--chunk 4096" \
    locking=striped
run_config "global, delayed" 200 "$total" 4 4 "--chunk 4096" \
    locking=global
# No delay, larger chunks, and two more threads writing the snapshot
# (snapshot writes racing origin copy-outs of the same chunks).
run_config "striped, no delay, 16K chunks, snapshot writers" "" \
    $(( total > 6 ? total / 2 : 3 )) 4 4 "--chunk 16384 --snap-writers 2" \
    locking=striped chunk-size=16K
# 64K chunks: every copy-out and many origin writes are 64 KiB or more,
# so they all go through a regular file's large-write lock
# (src/device-file.c) while the snapshot writers write the COW file too.
run_config "striped, no delay, 64K chunks, snapshot writers" "" \
    $(( total > 9 ? total / 3 : 3 )) 4 4 "--chunk 65536 --snap-writers 2" \
    locking=striped chunk-size=64K

finish
