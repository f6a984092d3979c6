#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# durability=flush with the persistent COW store on an NBD export: the
# boot id tells a process crash from a system stop only for a cache
# this host's kernel owns.  An NBD server keeps the unflushed writes in
# its own cache, which it can lose (power loss, restart) while this host
# runs on with the same boot id.  So a marked NBD store found after an
# unclean stop opens Invalid, even in the same boot.
#
#  1. nbdkit file plugin (the COW file behind a Unix socket), snapfg with
#     cow=nbd+unix://..., durability=flush; origin writes; kill -9 of
#     snapfg (the backend keeps running); restart with the same
#     SNAPFG_TEST_BOOT_ID: the snapshot is Invalid (EIO, status Invalid),
#     the log says why, and the header says valid = 0 without the mark.
#  2. The same with a local COW file, for contrast: valid, whole.
#  3. A clean stop of the NBD store clears the mark and it reopens valid.
set -euo pipefail
source "$(dirname "$0")/persistent-functions.sh"
require_persistent_tools
requires nbdkit

persistent_test_files
size=$((8 * 1024 * 1024))
cowfile="$tmpdir/cow-backend.img"
bsock="$tmpdir/backend.sock"
bpid=

# The backend: nbdkit's file plugin on the COW file.  Stopped after
# snapfg (nbdkit does not exit while a client is connected).
start_backend() {
    rm -f "$bsock"
    nbdkit -f -U "$bsock" file "$cowfile" 2>"$tmpdir/backend.log" &
    bpid=$!
    for _ in $(seq 300); do
        [ -S "$bsock" ] && return 0
        _proc_alive "$bpid" || { cat "$tmpdir/backend.log" >&2; fail "the backend nbdkit exited"; }
        sleep 0.1
    done
    fail "the backend nbdkit did not create $bsock"
}
stop_backend() {
    [ -n "$bpid" ] || return 0
    kill -TERM "$bpid" 2>/dev/null || true
    for _ in $(seq 100); do _proc_alive "$bpid" || break; sleep 0.1; done
    kill -KILL "$bpid" 2>/dev/null || true
    wait "$bpid" 2>/dev/null || true
    bpid=
}
_stop_all() {
    local pf
    for pf in "${!_nbdkit_pids[@]}"; do
        kill -KILL "${_nbdkit_pids[$pf]}" 2>/dev/null || true
    done
    stop_backend
}
on_exit _stop_all

mark() { dd if="$1" bs=1 skip=32 count=32 status=none | tr -d '\0'; }

fresh() {
    make_random_image "$origin" "$size"
    cp "$origin" "$pristine"
    rm -f "$cowfile" "$cow"
    truncate -s $((2 * size)) "$cowfile"
}

# ---- 1. NBD COW, kill -9, same boot: Invalid -----------------------------
info "=== durability=flush, COW on an NBD export, kill -9, same boot id"
fresh
start_backend
cowuri="nbd+unix:///?socket=$bsock"
SNAPFG_TEST_BOOT_ID=boot-A start_snapfg "$sock" "$pid" origin="$origin" cow="$cowuri" durability=flush
pio write-random "$(uri "$sock" origin)" --seed "$seed" --count 40 --max-len 65536 >/dev/null
m=$(mark "$cowfile")
[ "$m" = "SFGuboot-A" ] || check_fail "while running: the NBD store's mark is '$m', expected SFGuboot-A"
kill9_nbdkit "$pid"
SNAPFG_TEST_BOOT_ID=boot-A start_snapfg "$sock" "$pid" origin="$origin" cow="$cowuri" durability=flush
snapshot_is_invalid "NBD COW, kill -9, same boot" "$sock" $((size / 2)) 4096 0
export_equals "$(uri "$sock" origin)" "$origin" "NBD COW, kill -9: origin export == origin file"
grep -q "NBD export whose cache this host does not own" "$pid.log" ||
    check_fail "NBD COW, kill -9: the log does not say why the snapshot is Invalid"
stop_nbdkit "$pid"
v=$(header_le32 "$cowfile" 4)
m=$(mark "$cowfile")
[ "$v" = 0 ] && [ -z "$m" ] ||
    check_fail "NBD COW after the unclean stop: header valid = $v, mark '$m' (expected 0, none)"
info "ok: NBD COW, unclean stop, same boot: Invalid (valid = $v, no mark)"
# It stays Invalid (also with durability=sync).
SNAPFG_TEST_BOOT_ID=boot-A start_snapfg "$sock" "$pid" origin="$origin" cow="$cowuri"
st=$(snapshot_status "$sock")
[ "$st" = Invalid ] || check_fail "NBD COW, reopened again: status '$st', expected Invalid"
stop_nbdkit "$pid"
stop_backend

# ---- 2. a local COW file, for contrast: whole ------------------------------
info "=== durability=flush, local COW file, kill -9, same boot id"
fresh
SNAPFG_TEST_BOOT_ID=boot-A start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" durability=flush
pio write-random "$(uri "$sock" origin)" --seed "$seed" --count 40 --max-len 65536 >/dev/null
kill9_nbdkit "$pid"
SNAPFG_TEST_BOOT_ID=boot-A start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" durability=flush
export_equals "$(uri "$sock" snapshot)" "$pristine" "local COW, kill -9, same boot: snapshot == pristine"
stop_nbdkit "$pid"

# ---- 3. NBD COW, clean stop: valid ------------------------------------------
info "=== durability=flush, COW on an NBD export, clean stop"
fresh
start_backend
SNAPFG_TEST_BOOT_ID=boot-A start_snapfg "$sock" "$pid" origin="$origin" cow="$cowuri" durability=flush
pio write-random "$(uri "$sock" origin)" --seed "$seed" --count 40 --max-len 65536 >/dev/null
stop_nbdkit "$pid"
[ -z "$(mark "$cowfile")" ] || check_fail "NBD COW after a clean stop: the mark is still there"
SNAPFG_TEST_BOOT_ID=boot-B start_snapfg "$sock" "$pid" origin="$origin" cow="$cowuri" durability=flush
export_equals "$(uri "$sock" snapshot)" "$pristine" "NBD COW, clean stop, reopened: snapshot == pristine"
stop_nbdkit "$pid"
stop_backend

finish
