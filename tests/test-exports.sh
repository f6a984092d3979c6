#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Export names and list_exports: "" and "origin" serve the origin,
# "snapshot" (only with cow=) serves the snapshot, anything else is
# refused; nbdinfo --list shows both with descriptions, the snapshot's
# carrying the dm-style status line.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg
requires nbdinfo nbdcopy

size=$((4 * 1024 * 1024))
test_files "$size"

# nbdinfo_list URI: nbdinfo --list output, failing the test on error.
nbdinfo_list() {
    nbdinfo --list "$1" >"$tmpdir/list.out" 2>"$tmpdir/list.err" || {
        cat "$tmpdir/list.err" >&2
        fail "nbdinfo --list $1 failed"
    }
    cat "$tmpdir/list.out"
}

# description OUT EXPORT: the description line nbdinfo printed for EXPORT.
description() {
    awk -v want="export=\"$2\":" '
        /^export=/ { cur = $0 }
        cur == want && $1 == "description:" { sub(/^[ \t]*description: /, ""); print; exit }
    ' "$1"
}

# ---------------------------------------------------------------------
# 1. With cow= (and an explicit cow-size: the status total is known).
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" store=transient cow-size=1M
list=$(nbdinfo_list "$(uri "$sock")")
echo "$list" | grep -E '^export=|description' || true
grep -qx 'export="origin":' <<<"$list" || fail "nbdinfo --list does not show export origin"
grep -qx 'export="snapshot":' <<<"$list" || fail "nbdinfo --list does not show export snapshot"
echo "$list" >"$tmpdir/list1.out"
odesc=$(description "$tmpdir/list1.out" origin)
sdesc=$(description "$tmpdir/list1.out" snapshot)
[ -n "$odesc" ] || fail "origin has no description"
[ -n "$sdesc" ] || fail "snapshot has no description"
# dm status of a fresh transient snapshot with a 1 MiB store: 0/2048 0
grep -qE '(^|[^0-9])0/2048 0($|[^0-9])' <<<"$sdesc" ||
    fail "snapshot description '$sdesc' lacks the status line '0/2048 0'"
info "descriptions: origin='$odesc' snapshot='$sdesc'"

# The JSON form of the list says the same.
[ "$(export_description "$sock" origin)" = "$odesc" ] ||
    fail "nbdinfo --list --json: origin's description differs from '$odesc'"
[ "$(export_description "$sock" snapshot)" = "$sdesc" ] ||
    fail "nbdinfo --list --json: snapshot's description differs from '$sdesc'"

# Sizes.
osize=$(nbdinfo --size "$(uri "$sock" origin)")
ssize=$(nbdinfo --size "$(uri "$sock" snapshot)")
dsize=$(nbdinfo --size "$(uri "$sock")")
[ "$osize" -eq "$size" ] || fail "origin export size $osize != $size"
[ "$ssize" -eq "$size" ] || fail "snapshot export size $ssize != origin size $size"
[ "$dsize" -eq "$size" ] || fail "default export size $dsize != $size"

# Unknown export names are refused at the handshake.
for name in nope snapshot2 Origin origin/x; do
    if nbdinfo "$(uri "$sock" "$name")" >/dev/null 2>"$tmpdir/nope.err"; then
        fail "export '$name' was accepted; expected the handshake to fail"
    fi
done
info "unknown export names refused"

# All three names start with the original contents.
export_equals "$(uri "$sock")" "$orig"
export_equals "$(uri "$sock" origin)" "$orig"
export_equals "$(uri "$sock" snapshot)" "$orig"

# A write through "" is the origin: it shows on "origin", not on the
# snapshot, and lands in the origin file.  Three distinct 4K chunks.
fill_export "$(uri "$sock")" 0 4096 0xab
fill_export "$(uri "$sock" origin)" 65536 4096 0xcd
fill_export "$(uri "$sock")" $((1024 * 1024)) 4096 0xef
cp "$orig" "$tmpdir/expected.img"
printf '\xab%.0s' $(seq 4096) | dd of="$tmpdir/expected.img" conv=notrunc status=none
printf '\xcd%.0s' $(seq 4096) | dd of="$tmpdir/expected.img" bs=4096 seek=16 conv=notrunc status=none
printf '\xef%.0s' $(seq 4096) | dd of="$tmpdir/expected.img" bs=4096 seek=256 conv=notrunc status=none
export_equals "$(uri "$sock" origin)" "$tmpdir/expected.img"
export_equals "$(uri "$sock")" "$tmpdir/expected.img"
export_equals "$(uri "$sock" snapshot)" "$orig"
info "\"\" and origin are the same export; the snapshot kept the old data"

# Three chunks copied out: 3 * 4096 / 512 = 24 sectors allocated.
sdesc=$(export_description "$sock" snapshot)
grep -qE '(^|[^0-9])24/2048 0($|[^0-9])' <<<"$sdesc" ||
    fail "after 3 copy-outs the snapshot description is '$sdesc', expected status '24/2048 0'"
info "status after 3 copy-outs: '$sdesc'"

# A write to the snapshot does not reach the origin.
fill_export "$(uri "$sock" snapshot)" $((2 * 1024 * 1024)) 8192 0x11
export_equals "$(uri "$sock" origin)" "$tmpdir/expected.img"

stop_nbdkit "$pid"
cmp "$origin" "$tmpdir/expected.img" || fail "origin file differs from what was written"
[ "$(file_size "$cow")" -eq 0 ] || fail "transient COW file not truncated on exit"

# ---------------------------------------------------------------------
# 2. Default cow-size: the status total covers at least the origin.
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" store=transient
sdesc=$(export_description "$sock" snapshot)
total=$(echo "$sdesc" | grep -oE '[0-9]+/[0-9]+ [0-9]+' | tail -n1 | sed 's,^[0-9]*/\([0-9]*\) .*,\1,')
[ -n "$total" ] || fail "no dm status line in '$sdesc'"
[ "$total" -ge $((size / 512)) ] ||
    fail "default COW store holds $total sectors, less than the origin ($((size / 512)))"
grep -qE '(^|[^0-9])0/[0-9]+ 0($|[^0-9])' <<<"$sdesc" ||
    fail "fresh snapshot status is not '0/N 0': '$sdesc'"
# The new snapshot was taken at this start: it has the current origin.
export_equals "$(uri "$sock" snapshot)" "$tmpdir/expected.img"
stop_nbdkit "$pid"

# ---------------------------------------------------------------------
# 3. Without cow=: only the origin is listed, "snapshot" is refused.
start_snapfg "$sock" "$pid" origin="$origin"
list=$(nbdinfo_list "$(uri "$sock")")
grep -qx 'export="origin":' <<<"$list" || fail "without cow= origin is not listed"
if grep -q '^export="snapshot":' <<<"$list"; then
    fail "without cow= the snapshot export is listed"
fi
if nbdinfo "$(uri "$sock" snapshot)" >/dev/null 2>&1; then
    fail "without cow= the snapshot export is served"
fi
export_equals "$(uri "$sock")" "$tmpdir/expected.img"
export_equals "$(uri "$sock" origin)" "$tmpdir/expected.img"
stop_nbdkit "$pid"
info "without cow= only the origin is served"

# ---------------------------------------------------------------------
# 4. snapshot=NAME:COW (repeatable): more snapshots at start-up, each
# exported under its name, each frozen at start while the origin moves.
start_snapfg "$sock" "$pid" origin="$origin" cow="$tmpdir/s0.cow" \
    snapshot=first:"$tmpdir/s1.cow" snapshot=second:"$tmpdir/s2.cow"
list=$(nbdinfo_list "$(uri "$sock")")
for e in origin snapshot first second; do
    grep -qx "export=\"$e\":" <<<"$list" || fail "snapshot=: export $e not listed"
done
fill_export "$(uri "$sock" origin)" 0 65536 92
for e in snapshot first second; do
    export_equals "$(uri "$sock" "$e")" "$tmpdir/expected.img"
done
stop_nbdkit "$pid"
if try_start_failure "$tmpdir/snap.err" origin="$origin" snapshot=nocolon; then
    grep -q 'snapshot=nocolon' "$tmpdir/snap.err" ||
        check_fail "snapshot= without a COW: the error does not name the parameter: $(cat "$tmpdir/snap.err")"
fi
info "snapshot=NAME:COW adds snapshots at start-up"

finish
