#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A full persistent COW store (docs/design.md sections 1, 6) and the dm status
# line:
#  - status "<allocated>/<total> <metadata>" in 512-byte sectors as dm
#    computes it for a persistent store, while running and after a
#    restart, for 4K and 512-byte chunks and for a given cow-size=;
#  - the COW file never grows past cow-size= (given, or the default);
#  - Invalid: origin writes to more chunks than a small cow-size= holds
#    all succeed, the snapshot then fails with EIO, is described as
#    Invalid, the header says valid = 0 on disk, and it stays Invalid
#    after a restart;
#  - Overflow: the snapshot write that does not fit fails with ENOSPC,
#    the snapshot is described as Overflow and still reads its data; after
#    a restart it is valid again with the same data.
set -euo pipefail
source "$(dirname "$0")/persistent-functions.sh"
require_persistent_tools

persistent_test_files

# expected_status NEXC CS TOTAL-CHUNKS: dm's status line for a persistent
# store holding NEXC exceptions written in order: the next free chunk is
# after the header, the areas passed and the data chunks; metadata is
# the header plus the areas up to the current one.
expected_status() {
    local n=$1 cs=$2 total=$3 ppa spc full next
    ppa=$((cs / 16)); spc=$((cs / 512))
    full=$((n / ppa))                  # full areas: the current one is next
    next=$((2 + n + full))
    echo "$((next * spc))/$((total * spc)) $(( (full + 2) * spc ))"
}

# check_status WHAT WANT
check_status() {
    local got
    got=$(snapshot_status "$sock")
    if [ "$got" = "$2" ]; then
        info "ok: $1: status $got"
    else
        check_fail "$1: status '$got', expected '$2'"
    fi
}

# ====================================================================
# Status numbers in a normal state
# ====================================================================
status_case() {
    local cs=$1 osize=$2 cowsize=$3 what written total
    what="status, chunk $cs, cow-size=${cowsize:-default}"
    info "=== $what"
    make_random_image "$origin" "$osize"
    cp "$origin" "$pristine"
    rm -f "$cow"
    local ochunks=$(( (osize + cs - 1) / cs )) ppa=$((cs / 16))
    if [ -n "$cowsize" ]; then
        total=$((cowsize / cs))
        start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size="$cs" cow-size="$cowsize"
    else
        # (1 + origin chunks + areas + 1) chunks
        total=$((1 + ochunks + (ochunks + ppa - 1) / ppa + 1))
        start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size="$cs"
    fi
    check_status "$what, new store" "$(expected_status 0 "$cs" "$total")"
    written=0
    # Distinct whole chunks, in steps that end just before, at and just
    # after a full area.
    for n in 10 $((ppa - 1)) $ppa $((ppa + 1)) $((ppa + 44)); do
        pio write-chunks "$(uri "$sock" origin)" --chunk-size "$cs" \
            --chunks "$written-$((n - 1))" --seed "$n" >/dev/null
        written=$n
        check_status "$what, $n exceptions" "$(expected_status "$n" "$cs" "$total")"
    done
    # Snapshot writes to new chunks count the same; to remapped ones not.
    pio write-chunks "$(uri "$sock" snapshot)" --chunk-size "$cs" \
        --chunks "$((ochunks - 5))-$((ochunks - 1)),0,1" --piece 0:512 >/dev/null
    written=$((written + 5))
    check_status "$what, $written exceptions after snapshot writes" \
        "$(expected_status "$written" "$cs" "$total")"
    stop_nbdkit "$pid"
    if [ -n "$cowsize" ]; then
        start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" cow-size="$cowsize"
    else
        start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    fi
    check_status "$what, after restart" "$(expected_status "$written" "$cs" "$total")"
    stop_nbdkit "$pid"
    check_inspect "$cow" "$written" "$what"
}

status_case 4096 $((16 * 1024 * 1024)) ""
status_case 512 $((1024 * 1024 + 1536)) ""
status_case 4096 $((16 * 1024 * 1024)) $((4 * 1024 * 1024))

# ====================================================================
# The COW file never grows past cow-size= (given or default)
# ====================================================================
size_case() {
    local cs=$1 osize=$2 cowsize=$3 limit ochunks ppa csize
    ochunks=$(( (osize + cs - 1) / cs )); ppa=$((cs / 16))
    limit=${cowsize:-$(( (1 + ochunks + (ochunks + ppa - 1) / ppa + 1) * cs ))}
    make_random_image "$origin" "$osize"
    rm -f "$cow"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size="$cs" \
        ${cowsize:+cow-size=$cowsize}
    pio write-chunks "$(uri "$sock" origin)" --chunk-size "$cs" --chunks 0-1 \
        --piece 0:512 >/dev/null
    stop_nbdkit "$pid"
    csize=$(file_size "$cow")
    if [ "$csize" -le "$limit" ]; then
        info "ok: chunk $cs, cow-size=${cowsize:-default}: the COW file is $csize bytes (limit $limit)"
    else
        check_fail "chunk $cs, cow-size=${cowsize:-default}: the COW file is $csize bytes, more than the store's size $limit"
    fi
}
info "=== the COW file stays within cow-size="
size_case 4096 $((4 * 1024 * 1024)) $((64 * 1024))
size_case 65536 $((4 * 1024 * 1024)) ""
size_case 1048576 $((4 * 1024 * 1024)) ""

# ====================================================================
# Invalid: origin writes overflow a small store
# ====================================================================
CS=4096
cowsize=$((64 * 1024))            # header, area 0, 14 data chunks
ndata=$((cowsize / CS - 2))
osize=$((4 * 1024 * 1024))
info "=== Invalid: cow-size=64K ($ndata data chunks of $CS), origin writes to more chunks"
make_random_image "$origin" "$osize"
cp "$origin" "$pristine"
cp "$origin" "$origin_model"
rm -f "$cow"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" cow-size=64K
pio write-chunks "$(uri "$sock" origin)" --chunk-size $CS --chunks "0-$((ndata - 1))" \
    --model "$origin_model" >/dev/null || check_fail "Invalid: origin writes that fit failed"
check_status "Invalid: store exactly full" "$((cowsize / 512))/$((cowsize / 512)) 16"
export_equals "$(uri "$sock" snapshot)" "$pristine" "Invalid: the full store still holds the snapshot"
r=$(pio write-chunks "$(uri "$sock" origin)" --chunk-size $CS --chunks "$ndata-$((ndata + 9))" \
        --model "$origin_model" --seed 99) ||
    check_fail "Invalid: origin writes past the store's capacity failed: $r"
export_equals "$(uri "$sock" origin)" "$origin_model" "Invalid: the origin has every write"
snapshot_is_invalid "Invalid" "$sock" $((osize - 8192)) 8192 0
# On disk, durably, while still running.
[ "$(header_le32 "$cow" 4)" = 0 ] ||
    check_fail "Invalid: the COW header's valid field is $(header_le32 "$cow" 4) on disk, expected 0"
[ "$(header_le32 "$cow" 0)" = $((0x70416e53)) ] && [ "$(header_le32 "$cow" 8)" = 1 ] &&
    [ "$(header_le32 "$cow" 12)" = 8 ] ||
    check_fail "Invalid: the rest of the COW header changed"
# More origin writes still work.
pio write-random "$(uri "$sock" origin)" --seed "$seed" --count 20 --max-len 65536 \
    --model "$origin_model" >/dev/null
stop_nbdkit "$pid"
files_equal "$origin" "$origin_model" "Invalid: origin file"
csize=$(file_size "$cow")
[ "$csize" -le $cowsize ] ||
    check_fail "Invalid: the COW file is $csize bytes, more than cow-size=$cowsize"
"$SNAPFGCTL" inspect "$cow" >"$tmpdir/inspect.out" 2>&1 ||
    check_fail "Invalid: snapfgctl inspect exited non-zero"
[ "$(inspect_value "$tmpdir/inspect.out" status)" = Invalid ] ||
    check_fail "Invalid: snapfgctl inspect does not say Invalid"
info "Invalid: restart"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" cow-size=64K
st=$(snapshot_status "$sock")
[ "$st" = Invalid ] || check_fail "Invalid after restart: status '$st'"
r=$(pio read "$(uri "$sock" snapshot)" 0 4096)
[ "$r" = "errno EIO" ] || check_fail "Invalid after restart: snapshot read returned '$r', expected EIO"
pio write-random "$(uri "$sock" origin)" --seed $((seed + 1)) --count 5 --max-len 16384 \
    --model "$origin_model" >/dev/null
export_equals "$(uri "$sock" origin)" "$origin_model" "Invalid after restart: origin works"
stop_nbdkit "$pid"
[ "$(header_le32 "$cow" 4)" = 0 ] || check_fail "Invalid after restart: header valid is not 0"

# ====================================================================
# Overflow: snapshot writes fill the store
# ====================================================================
info "=== Overflow: cow-size=64K, snapshot writes to more chunks than fit"
make_random_image "$origin" "$osize"
cp "$origin" "$pristine"
cp "$origin" "$snap_model"
rm -f "$cow"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" cow-size=64K
# Sub-chunk writes: the rest of each chunk is copied from the origin.
out=$(pio write-chunks "$(uri "$sock" snapshot)" --chunk-size $CS \
          --chunks "0-$((ndata + 5))" --piece 1024:2048 --model "$snap_model") && st=0 || st=$?
want="error index $ndata chunk $ndata errno ENOSPC"
if [ "$st" -eq 3 ] && [ "$out" = "$want" ]; then
    info "ok: Overflow: the first write that does not fit: $out"
else
    check_fail "Overflow: snapshot writes gave '$out' (status $st), expected '$want'"
fi
st=$(snapshot_status "$sock")
[ "$st" = Overflow ] || check_fail "Overflow: nbdinfo --list describes the snapshot as '$st', expected Overflow"
# Still valid: reads (from the store and from the origin) and writes to
# chunks it already holds.
pio write-chunks "$(uri "$sock" snapshot)" --chunk-size $CS --chunks 3,7 \
    --piece 0:$CS --model "$snap_model" --seed 7 >/dev/null ||
    check_fail "Overflow: a snapshot write to a chunk the store holds failed"
export_equals "$(uri "$sock" snapshot)" "$snap_model" "Overflow: the snapshot reads its data"
r=$(pio pwrite "$(uri "$sock" snapshot)" $(( (ndata + 3) * CS )) 512)
[ "$r" = "errno ENOSPC" ] || check_fail "Overflow: a later write to a new chunk returned '$r', expected ENOSPC"
[ "$(header_le32 "$cow" 4)" = 1 ] || check_fail "Overflow: the header was marked invalid"
files_equal "$origin" "$pristine" "Overflow: the origin file is unchanged by snapshot writes"
stop_nbdkit "$pid"
check_inspect "$cow" "$ndata" "Overflow, after a clean stop"
info "Overflow: restart"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" cow-size=64K
check_status "Overflow after restart: valid again" "$((cowsize / 512))/$((cowsize / 512)) 16"
export_equals "$(uri "$sock" snapshot)" "$snap_model" "Overflow after restart: the same data"
stop_nbdkit "$pid"
csize=$(file_size "$cow")
[ "$csize" -le $cowsize ] ||
    check_fail "Overflow: the COW file is $csize bytes, more than cow-size=$cowsize"

finish
