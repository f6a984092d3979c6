#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Persistent COW store across clean restarts (docs/design.md sections 1, 2, 5):
#  - origin writes, clean stop, restart with the same origin=/cow=: the
#    snapshot still equals the pristine image byte for byte, the origin
#    has the writes; twice;
#  - snapshot writes survive a restart, the pristine data elsewhere too,
#    and never reach the origin file;
#  - a chunk-size= on restart that differs from the store's is overridden
#    by the store's (block_size_preferred of the snapshot export, the
#    description, the exception count of later writes, the data);
#  - snapfgctl inspect after each phase: exit 0, a dm status line, and as
#    many exceptions as distinct chunks were written.
set -euo pipefail
source "$(dirname "$0")/persistent-functions.sh"
require_persistent_tools

persistent_test_files
size=$((16 * 1024 * 1024))
CS=4096

make_random_image "$origin" "$size"
cp "$origin" "$pristine"
cp "$origin" "$origin_model"
cp "$origin" "$snap_model"
rm -f "$cow" "$chunks"

# check_views PHASE: the snapshot equals the snapshot model and the origin
# export equals the origin model.
check_views() {
    export_equals "$(uri "$sock" snapshot)" "$snap_model" "$1: snapshot"
    export_equals "$(uri "$sock" origin)" "$origin_model" "$1: origin"
}

# ---- phase 1: origin writes into a new store --------------------------
info "=== phase 1: origin writes into a new persistent store"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
[ "$(nbdinfo_field "$sock" snapshot block_size_preferred)" = $CS ] ||
    check_fail "phase 1: snapshot block_size_preferred is not the chunk size $CS"
pio write-random "$(uri "$sock" origin)" --seed "$seed" --count 150 \
    --max-len 65536 --model "$origin_model" --chunk-size $CS --chunks-out "$chunks"
# The snapshot is the pristine image while the server runs, too.
check_views "phase 1, before restart"
stop_nbdkit "$pid"
files_equal "$origin" "$origin_model" "phase 1: origin file has the writes"
[ "$(header_le32 "$cow" 0)" = $((0x70416e53)) ] ||
    check_fail "phase 1: COW header magic is not SnAp"
n1=$(count_distinct "$chunks")
check_inspect "$cow" "$n1" "phase 1 (after a clean stop)"
# The premise of the restarts below: more than one metadata area (256
# exceptions) to read back.
[ "$n1" -gt 256 ] ||
    check_fail "phase 1 wrote only $n1 chunks, which fit in one metadata area (256): the restart does not read several areas (seed $seed; more writes needed)"

info "=== phase 1: restart with the same origin= and cow="
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
check_views "phase 1, after restart"

# ---- phase 2: more origin writes, some on remapped chunks -------------
info "=== phase 2: more origin writes, restart again"
pio write-random "$(uri "$sock" origin)" --seed $((seed + 1)) --count 100 \
    --max-len 32768 --model "$origin_model" --chunk-size $CS --chunks-out "$chunks"
# Some of them on exactly the chunks of phase 1 (already remapped: no new
# exception) and some sub-chunk writes.
pio write-random "$(uri "$sock" origin)" --seed $((seed + 2)) --count 60 \
    --max-len 1024 --model "$origin_model" --chunk-size $CS --chunks-out "$chunks"
stop_nbdkit "$pid"
files_equal "$origin" "$origin_model" "phase 2: origin file has the writes"
n2=$(count_distinct "$chunks")
check_inspect "$cow" "$n2" "phase 2 (after a clean stop)"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
check_views "phase 2, after restart"

# ---- phase 3: snapshot writes -------------------------------------------
info "=== phase 3: snapshot writes survive a restart and never reach the origin"
# Whole-region random writes: some land on remapped chunks (fast path,
# into the COW copy), some on chunks the origin never changed (copy-out
# of the origin's data overlaid with the write).
pio write-random "$(uri "$sock" snapshot)" --seed $((seed + 3)) --count 80 \
    --max-len 20480 --model "$snap_model" --chunk-size $CS --chunks-out "$chunks"
# Sub-chunk snapshot writes in the last MiB, which the origin writes may
# or may not have touched.
pio write-random "$(uri "$sock" snapshot)" --seed $((seed + 4)) --count 40 \
    --max-len 1536 --region $((size - 1048576)):1048576 \
    --model "$snap_model" --chunk-size $CS --chunks-out "$chunks"
check_views "phase 3, before restart"
stop_nbdkit "$pid"
files_equal "$origin" "$origin_model" "phase 3: snapshot writes did not change the origin file"
n3=$(count_distinct "$chunks")
check_inspect "$cow" "$n3" "phase 3 (after a clean stop)"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
check_views "phase 3, after restart"

# Origin writes after snapshot writes: the snapshot keeps its own data.
pio write-random "$(uri "$sock" origin)" --seed $((seed + 5)) --count 60 \
    --max-len 65536 --model "$origin_model" --chunk-size $CS --chunks-out "$chunks"
stop_nbdkit "$pid"
n3b=$(count_distinct "$chunks")
check_inspect "$cow" "$n3b" "phase 3b (origin writes over snapshot-written chunks)"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
check_views "phase 3b, after restart"
stop_nbdkit "$pid"
# The pristine data is still where nobody wrote: compare the parts of
# the snapshot model outside the written chunks with the pristine image.
"$PY" - "$snap_model" "$pristine" "$chunks" $CS <<'EOF' || check_fail "snapshot model sanity: pristine data changed outside the snapshot-written chunks"
import sys
model, pristine, chunks, cs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
written = {int(l) for l in open(chunks)}
a, b = open(model, "rb").read(), open(pristine, "rb").read()
bad = [c for c in range(len(a) // cs)
       if c not in written and a[c*cs:(c+1)*cs] != b[c*cs:(c+1)*cs]]
sys.exit(1 if bad else 0)
EOF

# ---- phase 4: chunk-size= on restart differs from the store's ----------
for other in 64K 512; do
    info "=== phase 4: restart with chunk-size=$other (the store's $CS must win)"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size=$other
    pref=$(nbdinfo_field "$sock" snapshot block_size_preferred)
    if [ "$pref" = $CS ]; then
        info "ok: chunk-size=$other: block_size_preferred $pref"
    else
        check_fail "chunk-size=$other on restart: snapshot block_size_preferred is $pref, expected the store's $CS"
    fi
    desc=$(list_description "$sock" snapshot)
    case $desc in
        *"chunk $CS,"*) info "ok: description says chunk $CS" ;;
        *) check_fail "chunk-size=$other on restart: description '$desc' does not say chunk $CS" ;;
    esac
    check_views "chunk-size=$other, after restart"
    # Writes made now must be copied out in the store's chunks.
    pio write-random "$(uri "$sock" origin)" --seed $((seed + 6)) --count 30 \
        --max-len 2048 --model "$origin_model" --chunk-size $CS --chunks-out "$chunks"
    pio write-random "$(uri "$sock" snapshot)" --seed $((seed + 7)) --count 10 \
        --max-len 2048 --model "$snap_model" --chunk-size $CS --chunks-out "$chunks"
    check_views "chunk-size=$other, after writes"
    stop_nbdkit "$pid"
    [ "$(header_le32 "$cow" 12)" = $((CS / 512)) ] ||
        check_fail "chunk-size=$other on restart: the header's chunk size changed to $(header_le32 "$cow" 12) sectors"
    check_inspect "$cow" "$(count_distinct "$chunks")" "chunk-size=$other (after a clean stop)"
    seed=$((seed + 10))
done

info "=== final restart with defaults"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
check_views "final restart"
stop_nbdkit "$pid"
files_equal "$origin" "$origin_model" "final: origin file"
finish
