#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The persistent store's on-disk format (docs/design.md sections 1, 5, 6),
# checked against the documented dm-snapshot layout with an independent
# Python reader/writer (tests/make-cow.py):
#  (a) stores built by hand (several metadata areas, 4K and 512-byte
#      chunks) open in snapfg: the snapshot reads the COW data for
#      remapped chunks and the origin elsewhere; new exceptions are
#      appended where dm would put them;
#  (b) stores written by snapfg parse field by field: header, area
#      positions, pairs -> data chunks holding the pristine data,
#      terminator, zero tails, zero next area after a full one;
#  (c) corrupt stores are refused at start-up with a message naming the
#      file and the problem and are left unchanged, and snapfgctl
#      inspect rejects them; all-zero and empty files start a new store;
#  (d) a store whose header says valid = 0: the origin works, the
#      snapshot fails with EIO and is described as Invalid, the file is
#      not changed.
set -euo pipefail
source "$(dirname "$0")/persistent-functions.sh"
require_persistent_tools

persistent_test_files

# verify_store WHAT CS ORIGIN-SIZE SNAPSHOT-MODEL [ARGS...]: make-cow.py
# verify, recording a failure.
verify_store() {
    local what=$1 cs=$2 osize=$3 model=$4
    shift 4
    if make_cow verify --cow "$cow" --snapshot "$model" --chunk-size "$cs" \
           --origin-size "$osize" "$@" >"$tmpdir/verify.out" 2>&1; then
        info "ok: $what: $(cat "$tmpdir/verify.out")"
    else
        cat "$tmpdir/verify.out" >&2
        check_fail "$what: the store does not parse as documented"
    fi
}

# inspect_status_matches WHAT: snapfgctl's status line equals the one
# make-cow.py computed (last verify).
inspect_matches_verify() {
    local what=$1 out="$tmpdir/inspect.out" ours theirs
    inspect "$cow" "$out" || { cat "$out" >&2; check_fail "$what: inspect exited non-zero"; return; }
    ours=$(sed -n 's/.*status \([0-9/ ]*\)$/\1/p' "$tmpdir/verify.out")
    theirs=$(inspect_value "$out" status)
    [ "$ours" = "$theirs" ] ||
        check_fail "$what: snapfgctl inspect says status '$theirs', the documented layout gives '$ours'"
}

# ====================================================================
# (a) stores built by hand
# ====================================================================
hand_case() {
    local cs=$1 osize=$2 nexc=$3 what="hand-built store, chunk $1, $3 exceptions"
    info "=== (a) $what"
    make_random_image "$origin" "$osize"
    cp "$origin" "$origin_model"
    rm -f "$cow" "$chunks"
    # The last origin chunk is always remapped (it may be partial).
    make_cow build --origin "$origin" --chunk-size "$cs" --exceptions "$nexc" \
        --out "$cow" --expected "$snap_model" --seed "$seed" \
        --include $(( (osize - 1) / cs ))
    cmp -s "$snap_model" "$origin" && fail "$what: the built store changes nothing"
    check_inspect "$cow" "$nexc" "$what: snapfgctl reads the hand-built store"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size=64K
    [ "$(nbdinfo_field "$sock" snapshot block_size_preferred)" = "$(( cs > 512 ? cs : 512 ))" ] ||
        check_fail "$what: the store's chunk size $cs is not the snapshot's preferred block size"
    export_equals "$(uri "$sock" snapshot)" "$snap_model" "$what: snapshot = COW data where remapped, origin elsewhere"
    export_equals "$(uri "$sock" origin)" "$origin_model" "$what: origin export unchanged"
    # Origin writes: on remapped chunks nothing is copied; elsewhere new
    # exceptions go after the hand-built ones (same area, next slots).
    "$PY" -c "
import struct, sys
cs, n = $cs, $nexc
ppa = cs // 16
f = open('$cow', 'rb')
for k in range(n):
    area, idx = divmod(k, ppa)
    f.seek((1 + (ppa + 1) * area) * cs + idx * 16)
    print(struct.unpack('<QQ', f.read(16))[0])
" >"$chunks"
    pio write-random "$(uri "$sock" origin)" --seed $((seed + 1)) --count 40 \
        --max-len $((cs * 3)) --model "$origin_model" --chunk-size "$cs" --chunks-out "$chunks"
    export_equals "$(uri "$sock" snapshot)" "$snap_model" "$what: snapshot unchanged by origin writes"
    stop_nbdkit "$pid"
    files_equal "$origin" "$origin_model" "$what: origin file has the writes"
    verify_store "$what, after origin writes through snapfg" "$cs" "$osize" "$snap_model" \
        --expect-chunks "$chunks" --dense
    inspect_matches_verify "$what"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    export_equals "$(uri "$sock" snapshot)" "$snap_model" "$what: snapshot after restart"
    stop_nbdkit "$pid"
}

hand_case 4096 $((8 * 1024 * 1024)) 300       # area 0 full, area 1 partly
hand_case 4096 $((8 * 1024 * 1024)) 256       # area 0 full, area 1 empty
hand_case 512 $((1024 * 1024)) 400            # 12 full areas of 32 pairs
# An origin that is not a whole number of chunks: the last chunk is
# partial.
hand_case 65536 $((4 * 1024 * 1024 + 12288)) 40

# ====================================================================
# (b) stores written by snapfg
# ====================================================================
written_case() {
    local cs=$1 osize=$2 count=$3 maxlen=$4 what="snapfg-written store, chunk $1"
    local half=$(( osize / 2 / cs * cs ))
    info "=== (b) $what"
    make_random_image "$origin" "$osize"
    cp "$origin" "$pristine"
    rm -f "$cow" "$chunks" "$chunks.1" "$chunks.2"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size="$cs"
    # Two clients at once on separate halves: group commits.
    pio write-random "$(uri "$sock" origin)" --seed $((seed + 2)) --count "$count" \
        --max-len "$maxlen" --chunk-size "$cs" --chunks-out "$chunks.1" \
        --region 0:$half >/dev/null &
    local p1=$!
    pio write-random "$(uri "$sock" origin)" --seed $((seed + 3)) --count "$count" \
        --max-len "$maxlen" --chunk-size "$cs" --chunks-out "$chunks.2" \
        --region $half:$((osize - half)) >/dev/null
    wait $p1 || fail "$what: writer failed"
    # The last chunk (partial if the origin is not a whole number of
    # chunks): its copy holds only what the origin has.
    pio write-chunks "$(uri "$sock" origin)" --chunk-size "$cs" \
        --chunks $(( (osize - 1) / cs )) --piece 0:512 --chunks-out "$chunks.2" >/dev/null
    cat "$chunks.1" "$chunks.2" >"$chunks"
    stop_nbdkit "$pid"
    info "$what: $(count_distinct "$chunks") chunks written"
    verify_store "$what" "$cs" "$osize" "$pristine" --expect-chunks "$chunks" --dense
    inspect_matches_verify "$what"
}

written_case 4096 $((8 * 1024 * 1024 + 1536)) 60 65536   # ~ 3-4 areas; partial last chunk
written_case 512 $((2 * 1024 * 1024)) 60 8192        # many areas of 32

# Exactly one full area: the next area must be zero on disk (the kernel
# would read stale pairs from it otherwise), and the next exception goes
# into it.
for cs in 4096 512; do
    what="snapfg-written store, chunk $cs, exactly one full area"
    info "=== (b) $what"
    ppa=$((cs / 16))
    osize=$((ppa * 4 * cs))
    make_random_image "$origin" "$osize"
    cp "$origin" "$pristine"
    # Poison the place of area 1 so that a store that does not zero it
    # is caught (an all-zero file is a new store, so only after the
    # header is written: start, stop, poison, restart).
    rm -f "$cow"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size="$cs"
    stop_nbdkit "$pid"
    area1=$((1 + ppa + 1))
    if [ "$(file_size "$cow")" -ge $(( (area1 + 1) * cs )) ]; then
        head -c "$cs" /dev/urandom |
            dd of="$cow" bs="$cs" seek="$area1" conv=notrunc status=none
    fi
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    seq 0 2 $(( (ppa - 1) * 2 )) >"$chunks"
    pio write-chunks "$(uri "$sock" origin)" --chunk-size "$cs" \
        --chunks "$(seq -s, 0 2 $(( (ppa - 1) * 2 )))" --piece 0:512 >/dev/null
    stop_nbdkit "$pid"
    verify_store "$what" "$cs" "$osize" "$pristine" --expect-chunks "$chunks" \
        --expect-count "$ppa" --dense
    grep -q "current area 1 with 0 pairs" "$tmpdir/verify.out" ||
        check_fail "$what: expected area 0 full and area 1 empty: $(cat "$tmpdir/verify.out")"
    inspect_matches_verify "$what"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    export_equals "$(uri "$sock" snapshot)" "$pristine" "$what: snapshot after restart"
    pio write-chunks "$(uri "$sock" origin)" --chunk-size "$cs" --chunks 1 --piece 0:512 >/dev/null
    echo 1 >>"$chunks"
    stop_nbdkit "$pid"
    verify_store "$what, one more" "$cs" "$osize" "$pristine" --expect-chunks "$chunks" \
        --expect-count $((ppa + 1)) --dense
    got=$(make_cow get-pair "$cow" --chunk-size "$cs" --area 1 --index 0)
    [ "$got" = "1 $((area1 + 1))" ] ||
        check_fail "$what: the next exception is '$got' at area 1 pair 0, expected '1 $((area1 + 1))'"
done

# ====================================================================
# (c) corrupt stores
# ====================================================================
info "=== (c) corrupt stores"
CS=4096
osize=$((8 * 1024 * 1024))
make_random_image "$origin" "$osize"
base="$tmpdir/base-cow.img"
make_cow build --origin "$origin" --chunk-size $CS --exceptions 300 \
    --out "$base" --expected "$snap_model" --seed "$seed" --extra-chunks 3 >/dev/null
ppa=$((CS / 16))
area1=$((1 + ppa + 1))
old0=$(make_cow get-pair "$base" --chunk-size $CS --area 0 --index 0 | cut -d' ' -f1)

# corrupt_case NAME PATTERN INSPECT(yes/no) MUTATION...: copy the base
# store, apply MUTATION (eval'd, $c is the file), and require that
# nbdkit refuses it naming the file and matching PATTERN (grep -Ei), that
# the file is unchanged, and (if INSPECT=yes) that snapfgctl inspect
# exits 1 with such a message.
corrupt_case() {
    local name=$1 pattern=$2 check_inspect=$3 c="$tmpdir/corrupt-$1.img" before after st
    shift 3
    cp "$base" "$c"
    eval "$@"
    before=$(checksum "$c")
    local err="$tmpdir/corrupt-$name.err"
    if try_start_failure "$err" origin="$origin" cow="$c"; then
        if grep -qF -- "$c" "$err" && grep -qEi -- "$pattern" "$err"; then
            info "ok: $name: refused: $(grep -F -- "$c" "$err" | head -n1)"
        else
            cat "$err" >&2
            check_fail "$name: the error does not name the file and the problem (/$pattern/)"
        fi
    fi
    [ -e "$c" ] || { check_fail "$name: the refused COW file was removed"; return; }
    after=$(checksum "$c")
    [ "$before" = "$after" ] || check_fail "$name: the refused COW file was changed"
    if [ "$check_inspect" = yes ]; then
        st=0
        "$SNAPFGCTL" inspect "$c" >"$err.inspect" 2>&1 || st=$?
        if [ "$st" -ne 1 ]; then
            cat "$err.inspect" >&2
            check_fail "$name: snapfgctl inspect exited $st, expected 1"
        elif ! grep -qEi -- "$pattern" "$err.inspect" || ! grep -qF -- "$c" "$err.inspect"; then
            cat "$err.inspect" >&2
            check_fail "$name: snapfgctl inspect's message does not name the file and the problem (/$pattern/)"
        else
            info "ok: $name: inspect: $(grep -F -- "$c" "$err.inspect" | tail -n1)"
        fi
        [ "$before" = "$(checksum "$c")" ] || check_fail "$name: snapfgctl inspect changed the file"
    fi
}

# Sanity: the base store itself is accepted by both.
check_inspect "$base" 300 "base store for the corruption cases"
expect_start_success origin="$origin" cow="$base"

corrupt_case other-magic 'magic' yes \
    'make_cow set-header "$c" --magic 0x12345678'
corrupt_case version-2 'version' yes \
    'make_cow set-header "$c" --version 2'
corrupt_case truncated-area 'truncat|past the end|short' yes \
    'truncate -s $(( area1 * CS + CS / 2 )) "$c"'
corrupt_case pair-past-end 'past the end' yes \
    'make_cow set-pair "$c" --chunk-size $CS --area 1 --index 3 --new 1000000'
corrupt_case pair-at-metadata 'metadata' yes \
    'make_cow set-pair "$c" --chunk-size $CS --area 1 --index 3 --new $area1'
corrupt_case pair-at-header 'metadata|header' yes \
    'make_cow set-pair "$c" --chunk-size $CS --area 0 --index 7 --new 1'
corrupt_case two-pairs-one-chunk 'two pairs|twice|duplicate' yes \
    'make_cow set-pair "$c" --chunk-size $CS --area 1 --index 5 --old $old0'
# Two pairs keeping their data in one COW chunk (issue 29 item 7): the
# snapshot would read one origin chunk's data for the other, and a write
# to either would change both.  The message names both pairs.
new13=$(make_cow get-pair "$base" --chunk-size $CS --area 1 --index 3 | cut -d' ' -f2)
old13=$(make_cow get-pair "$base" --chunk-size $CS --area 1 --index 3 | cut -d' ' -f1)
old14=$(make_cow get-pair "$base" --chunk-size $CS --area 1 --index 4 | cut -d' ' -f1)
new00=$(make_cow get-pair "$base" --chunk-size $CS --area 0 --index 0 | cut -d' ' -f2)
old15=$(make_cow get-pair "$base" --chunk-size $CS --area 1 --index 5 | cut -d' ' -f1)
corrupt_case two-pairs-share-a-cow-chunk \
    "metadata area 1 pair 3 \(origin chunk $old13\) and metadata area 1 pair 4 \(origin chunk $old14\) both keep their data in COW chunk $new13" yes \
    'make_cow set-pair "$c" --chunk-size $CS --area 1 --index 4 --new $new13'
corrupt_case pair-shares-an-earlier-areas-chunk \
    "metadata area 0 pair 0 \(origin chunk $old0\) and metadata area 1 pair 5 \(origin chunk $old15\) both keep their data in COW chunk $new00" yes \
    'make_cow set-pair "$c" --chunk-size $CS --area 1 --index 5 --new $new00'
corrupt_case random-junk 'magic|not a' yes \
    'head -c 1048576 /dev/urandom >"$c"'
corrupt_case zero-magic-not-zero 'not all zero|magic' yes \
    'dd if=/dev/zero of="$c" bs=512 count=1 conv=notrunc status=none'
corrupt_case chunk-size-3 'chunk size' yes \
    'make_cow set-header "$c" --chunk-sectors 3'
corrupt_case valid-7 'valid' yes \
    'make_cow set-header "$c" --valid 7'
corrupt_case short-junk 'small|magic|not' yes \
    'printf "not a store" >"$c"'
# Only snapfg knows the origin's size, so inspect cannot check this one.
corrupt_case old-past-origin 'origin' no \
    'make_cow set-pair "$c" --chunk-size $CS --area 1 --index 2 --old $(( osize / CS + 5 ))'

# A persistent store given to store=transient is refused, unchanged.
c="$tmpdir/persistent-for-transient.img"
cp "$base" "$c"
before=$(checksum "$c")
if try_start_failure "$tmpdir/transient.err" origin="$origin" cow="$c" store=transient; then
    grep -qF -- "$c" "$tmpdir/transient.err" ||
        check_fail "store=transient on a persistent store: the error does not name the file"
    info "ok: store=transient on a persistent store refused"
fi
[ "$(checksum "$c")" = "$before" ] || check_fail "store=transient changed a persistent store"

# Stale pairs after the terminator of the current area.  The kernel
# treats them as live as soon as a pair is appended before them, so a
# store that holds them must either be refused, or be reopened with the
# area kept zero past its last pair (docs/design.md section 5): appending must
# not bring them to life.
info "=== (c) stale pairs after the terminator of the current area"
ochunks=$((osize / CS))
# Chunks 0 and 1 (written below) and the stale pairs' origin chunks must
# not be among the 10 remapped ones, whatever the seed.
make_cow build --origin "$origin" --chunk-size $CS --exceptions 10 \
    --out "$cow" --expected "$snap_model" --seed "$seed" --extra-chunks 20 \
    --exclude "0,1,$((ochunks - 8)),$((ochunks - 7)),$((ochunks - 6))" >/dev/null
for i in 12 13 14; do
    # plausible pairs: origin chunks not remapped, data chunks in the file
    make_cow set-pair "$cow" --chunk-size $CS --area 0 --index $i \
        --old $((ochunks - 20 + i)) --new $((i + 2))
done
before=$(checksum "$cow")
st=0
timeout 60 nbdkit -U - --run true "$SNAPFG_PLUGIN" origin="$origin" cow="$cow" \
    >/dev/null 2>"$tmpdir/stale.err" || st=$?
if [ "$st" -eq 1 ]; then
    info "ok: stale pairs: refused: $(head -n1 "$tmpdir/stale.err")"
    grep -qF -- "$cow" "$tmpdir/stale.err" || check_fail "stale pairs: the error does not name the file"
    [ "$(checksum "$cow")" = "$before" ] || check_fail "stale pairs: the refused file was changed"
elif [ "$st" -ne 0 ]; then
    cat "$tmpdir/stale.err" >&2
    check_fail "stale pairs: nbdkit exited with status $st"
else
    cp "$origin" "$origin_model"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    export_equals "$(uri "$sock" snapshot)" "$snap_model" "stale pairs: accepted; the snapshot ignores them"
    # Two new exceptions: pairs 10 and 11, right before the stale ones.
    pio write-chunks "$(uri "$sock" origin)" --chunk-size $CS --chunks 0,1 \
        --piece 0:512 --model "$origin_model" >/dev/null
    stop_nbdkit "$pid"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    export_equals "$(uri "$sock" snapshot)" "$snap_model" \
        "stale pairs: after appending two exceptions and a restart the snapshot is unchanged"
    stop_nbdkit "$pid"
    n=$("$SNAPFGCTL" inspect "$cow" 2>/dev/null | sed -n 's/^exceptions: //p')
    [ "$n" = 12 ] || check_fail "stale pairs: after appending two exceptions to 10 the store holds '$n' (stale pairs came to life)"
    got=$(make_cow get-pair "$cow" --chunk-size $CS --area 0 --index 12)
    [ "$got" = "0 0" ] || check_fail "stale pairs: area 0 is not zero past its last pair after appending (pair 12 is '$got')"
fi

# All-zero and empty files start a new store.
for kind in all-zero empty; do
    what="$kind COW file"
    cp "$origin" "$pristine"
    if [ $kind = empty ]; then : >"$cow"; else make_zero_image "$cow" $((3 * 1024 * 1024)); fi
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    pio write-random "$(uri "$sock" origin)" --seed $((seed + 4)) --count 10 \
        --max-len 16384 >/dev/null
    export_equals "$(uri "$sock" snapshot)" "$pristine" "$what: starts a new snapshot"
    stop_nbdkit "$pid"
    [ "$(header_le32 "$cow" 0)" = $((0x70416e53)) ] && [ "$(header_le32 "$cow" 4)" = 1 ] ||
        check_fail "$what: no valid header written"
    cp "$pristine" "$origin"
done

# ====================================================================
# (d) header valid = 0
# ====================================================================
info "=== (d) a store marked Invalid on disk"
make_random_image "$origin" "$osize"
cp "$origin" "$origin_model"
make_cow build --origin "$origin" --chunk-size $CS --exceptions 50 \
    --out "$cow" --expected "$snap_model" --seed "$seed" --valid 0 >/dev/null
before=$(checksum "$cow")
head_before=$(od -An -tx1 -N16 "$cow")
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
# The origin works: write, read back.
pio write-random "$(uri "$sock" origin)" --seed $((seed + 5)) --count 20 \
    --max-len 65536 --model "$origin_model" >/dev/null
export_equals "$(uri "$sock" origin)" "$origin_model" "valid=0: origin export reads and writes"
snapshot_is_invalid "valid=0" "$sock" $((osize - 65536)) 65536 8192
stop_nbdkit "$pid"
[ "$(od -An -tx1 -N16 "$cow")" = "$head_before" ] || check_fail "valid=0: the header changed"
[ "$(checksum "$cow")" = "$before" ] || check_fail "valid=0: the Invalid store's file was written to"
files_equal "$origin" "$origin_model" "valid=0: origin file has the writes"
"$SNAPFGCTL" inspect "$cow" >"$tmpdir/inspect.out" 2>&1 ||
    check_fail "valid=0: snapfgctl inspect exited non-zero"
[ "$(inspect_value "$tmpdir/inspect.out" status)" = Invalid ] ||
    check_fail "valid=0: snapfgctl inspect does not say Invalid"

finish
