#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The origin file is truncated (shrunk) under the running server.
#
# Run once with 4K chunks (copy-outs through a buffer) and once with
# 128K chunks (copy-outs with copy_file_range, which copies nothing past
# the end of a file), both with write-back (the default), and with 4K
# chunks and writeback=off.  Two persistent snapshots: "snapshot" (started
# with cow=) and "held", which holds its own copy of every chunk from
# the new end on (snapshot writes made before the truncation).  Then
# the origin is cut to 2 MiB + 6 KiB, inside a chunk, and:
#   - origin reads, writes and zeroes past the new end, or across it,
#     fail with EIO; the file does not grow; reads and writes before the
#     new end still work, data checked byte for byte;
#   - the new size is logged once, and the failing requests are not
#     logged one by one;
#   - "snapshot" read some of the lost data from the origin, so it is
#     Invalid (in its header too) and gained no exception: no copy-out
#     stored the zeroes a read past the end used to return;
#   - "held" lost nothing: it stays valid and reads back byte for byte;
#   - a first write made before the truncation and not flushed (write-back
#     may hold it) reads back and reaches the file.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
requires truncate

size=$((4 * 1024 * 1024))
new_size=$((2 * 1024 * 1024 + 6 * 1024))
test_files

snap_state() {
    ctl "$ctlsock" --json status "$1" || { echo "status-failed"; return 0; }
    jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["state"]'
}
# table_pairs COW CHUNK: the pairs in the store's exception table (read
# from the file itself: snapfgctl inspect does not read an Invalid one).
table_pairs() {
    "$PY" -c '
import struct, sys
f = open(sys.argv[1], "rb"); cs = int(sys.argv[2]); ppa = cs // 16
n, area = 0, 0
while True:
    f.seek((1 + (ppa + 1) * area) * cs)
    buf = f.read(cs)
    for i in range(ppa):
        old, new = struct.unpack_from("<QQ", buf, i * 16)
        if new == 0:
            print(n); sys.exit(0)
        n += 1
    area += 1
' "$1" "$2"
}
snap_exceptions() {
    ctl "$ctlsock" --json status "$1" || { echo "status-failed"; return 0; }
    jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["exceptions"]'
}
header_valid() { od -An -t u4 --endian=little -j 4 -N 4 "$1" | tr -d ' '; }
# expect_io WHAT COMMAND...: a failures-io command whose expectation must hold.
expect_io() {
    local what=$1
    shift
    if failures_io "$@" >"$tmpdir/fio.out" 2>&1; then
        info "ok: $what"
    else
        check_fail "$what: $(cat "$tmpdir/fio.out")"
    fi
}

run() {
    local chunk=$1 cow="$tmpdir/snap-$1.cow" held="$tmpdir/held-$1.cow" first n log
    shift
    info "=== chunk size $chunk $*"
    make_random_image "$origin" "$size"
    rm -f "$cow" "$held"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" chunk-size=$chunk control="$ctlsock" "$@"
    log="$pid.log"
    ctl_ok "create held" "$ctlsock" create held --cow "$held" --chunk-size $chunk
    cp "$origin" "$tmpdir/snapview.img"
    cp "$origin" "$tmpdir/heldview.img"
    first=$((new_size / chunk))     # the chunk the new end falls in
    failures_io writes "$(uri "$sock" held)" --chunks "$first:$((size / chunk - first))" \
        --chunk-size "$chunk" --seed 1 --model "$tmpdir/heldview.img" >/dev/null ||
        fail "snapshot writes to held failed"
    # Ten origin chunks change: both snapshots preserve them.
    failures_io write "$(uri "$sock" origin)" 0 $((10 * chunk)) --seed 2 >/dev/null ||
        fail "origin write before the truncation failed"
    # With write-back the file holds an acknowledged write only once a
    # flush covered it (then its exceptions are committed too).
    failures_io flush "$(uri "$sock" origin)" >/dev/null || fail "origin flush failed"
    cp "$origin" "$tmpdir/origin-model.img"
    # One more first write before the new end, not flushed: write-back
    # may still hold it when the file shrinks; it must reach the file
    # (checked at the end) and read back all the same.
    failures_io write "$(uri "$sock" origin)" $((11 * chunk)) 4096 --seed 4 \
        --model "$tmpdir/origin-model.img" >/dev/null ||
        fail "unflushed origin write before the truncation failed"

    truncate -s "$new_size" "$origin"
    truncate -s "$new_size" "$tmpdir/origin-model.img"
    info "origin truncated to $new_size bytes"

    # First an origin write needing a copy-out into "snapshot" from past
    # the new end: the copy-out's read fails, nothing is stored.
    expect_io "origin write past the new end fails with EIO" write "$(uri "$sock" origin)" $((3 * 1024 * 1024)) 4096 --expect EIO
    expect_io "origin read before the new end" read "$(uri "$sock" origin)" 0 $((1024 * 1024)) --model "$tmpdir/origin-model.img"
    expect_io "origin read across the new end fails with EIO" read "$(uri "$sock" origin)" $((new_size - 2048)) 4096 --expect EIO
    expect_io "origin read past the new end fails with EIO" read "$(uri "$sock" origin)" $((3 * 1024 * 1024)) 4096 --expect EIO
    expect_io "origin write across the new end fails with EIO" write "$(uri "$sock" origin)" $((new_size - 512)) 1024 --expect EIO
    expect_io "origin zero past the new end fails with EIO" zero "$(uri "$sock" origin)" $((3 * 1024 * 1024)) 65536 --expect EIO
    [ "$(file_size "$origin")" = "$new_size" ] && info "ok: the origin file did not grow" ||
        check_fail "the origin file is now $(file_size "$origin") bytes, expected $new_size (a request past the end grew it)"
    # A chunk neither snapshot holds yet: held copies it out.
    expect_io "origin write before the new end" write "$(uri "$sock" origin)" $((3 * 512 * 1024 + 4096)) 4096 --seed 3 --model "$tmpdir/origin-model.img"
    expect_io "origin read-back before the new end" read "$(uri "$sock" origin)" 0 $((new_size - new_size % chunk)) --model "$tmpdir/origin-model.img"
    expect_io "snapshot read past the new end fails with EIO" read "$(uri "$sock" snapshot)" $((3 * 1024 * 1024)) 4096 --expect EIO

    n=$(grep -c "shrank to $new_size bytes" "$log" || true)
    [ "$n" = 1 ] && info "ok: the new size is logged once: $(grep -m1 shrank "$log")" ||
        check_fail "the log says 'shrank to $new_size bytes' $n times, expected once"
    n=$(grep -cE 'origin=.*(read|write|zero).* failed' "$log" || true)
    [ "$n" = 0 ] && info "ok: the failing requests are not logged one by one" ||
        check_fail "$n failing requests logged one by one: $(grep -m3 -E 'origin=.*failed' "$log")"

    # (The unflushed write's exception counts only if its commit came
    # before the shrink made the snapshot Invalid.)
    n=$(snap_exceptions snapshot)
    [ "$n" = 10 ] || [ "$n" = 11 ] && info "ok: snapshot gained no exception past the end ($n, from before the truncation)" ||
        check_fail "snapshot holds '$n' exceptions, expected 10 or 11 (a copy-out past the end stored something)"
    n=$(snap_state snapshot)
    [ "$n" = Invalid ] && info "ok: snapshot, which lost data, is Invalid" ||
        check_fail "snapshot is '$n' after losing data to the truncation, expected Invalid"
    n=$(snap_state held)
    [ "$n" = valid ] && info "ok: held, which lost nothing, is valid" ||
        check_fail "held is '$n', expected valid"
    export_equals "$(uri "$sock" held)" "$tmpdir/heldview.img" "held reads back byte for byte"
    stop_nbdkit "$pid"

    n=$(table_pairs "$cow" "$chunk")
    [ "$n" = 10 ] || [ "$n" = 11 ] && info "ok: snapshot's table on disk holds the $n exceptions from before the truncation" ||
        check_fail "snapshot's table on disk holds '$n' exceptions, expected 10 or 11"
    [ "$(header_valid "$cow")" = 0 ] && info "ok: snapshot's header records it Invalid" ||
        check_fail "snapshot's header says valid = $(header_valid "$cow")"
    n=$(table_pairs "$held" "$chunk")
    [ "$n" = $((size / chunk - first + 12)) ] && info "ok: held's table on disk holds $n exceptions" ||
        check_fail "held's table on disk holds '$n' exceptions, expected $((size / chunk - first + 12))"
    files_equal "$origin" "$tmpdir/origin-model.img" "the origin file holds every write made before its new end"
}

run 4096
run $((128 * 1024))
run 4096 writeback=off

finish
