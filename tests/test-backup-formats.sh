#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup's images at rest: --compress=zstd|zlib (qcow2
# compressed clusters) and --encrypt --key-file (qcow2 LUKS), for fulls
# and incrementals; restore and verify read them; a missing or wrong key
# is a clear error and writes nothing; qemu-img dies with the tool
# (SIGTERM, kill -9).  Every restore is compared byte
# for byte with the origin saved at the run's instant.

set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools

backup_server $((16 * 1024 * 1024)) make_compressible
# A key derivation of 10 ms, not 2 s (each image opened derives it).
export SNAPFG_BACKUP_TEST_LUKS_ITER_TIME=10

compressed_clusters() {         # the percentage qemu-img check reports
    qemu-img check "$@" 2>/dev/null | sed -n 's/.* \([0-9.]*\)% compressed clusters.*/\1/p'
}

# --- compression: zstd and zlib, full and incremental -----------------------
for algo in zstd zlib; do
    d="$tmpdir/c-$algo"
    bk_run "$d" 1 --compress=$algo
    write_random_blocks "$origin" 30 11 "$size"
    bk_run "$d" 2 --compress=$algo
    for n in 1 2; do bk_restores "$d" $n; done
    img=$(manifest_field "$d" 1 image)
    pc=$(compressed_clusters "$d/$img")
    info "--compress=$algo: full image $(stat -c %s "$d/$img") bytes ($pc % compressed clusters) for a $size-byte disk"
    [ -n "$pc" ] && [ "${pc%%.*}" -ge 50 ] ||
        check_fail "--compress=$algo: the full image has '$pc'% compressed clusters"
    [ "$(stat -c %s "$d/$img")" -lt $((size * 3 / 4)) ] ||
        check_fail "--compress=$algo: the full image is $(stat -c %s "$d/$img") bytes for a $size-byte disk with 8 MiB of pattern"
    [ "$(compressed_clusters "$d/0002-incr.qcow2")" != "0.00" ] ||
        check_fail "--compress=$algo: the incremental has no compressed clusters"
    qemu-img info "$d/$img" | grep -q "compression type: $algo" ||
        check_fail "--compress=$algo: $(qemu-img info "$d/$img" | grep compression)"
    [ "$(manifest_field "$d" 2 compression)" = $algo ] || check_fail "run 2 does not record its compression"
    drop_our_checkpoints
done
st=0; bk -S "$ctl" -u "$origin" backup "$tmpdir/c-x" --compress=lz4 || st=$?
[ "$st" -eq 2 ] || check_fail "--compress=lz4: exit $st, expected 2"

# --- encryption --------------------------------------------------------------
d="$tmpdir/enc"
printf 'correct horse battery staple' >"$tmpdir/key"
printf 'wrong' >"$tmpdir/badkey"
st=0; bk -S "$ctl" -u "$origin" backup "$d" --encrypt || st=$?
bk_expect_status 2 "--encrypt without --key-file" 'key-file' "$st"
bk_run "$d" 1 --encrypt --key-file "$tmpdir/key" --compress
write_random_blocks "$origin" 30 12 "$size"
bk_run "$d" 2 --key-file "$tmpdir/key"
write_random_blocks "$origin" 30 13 "$size"
bk_run "$d" 3 --key-file "$tmpdir/key"
qemu-img info "$d/0001-full.qcow2" | grep -q 'encrypted: yes' || check_fail "the full image is not encrypted"
qemu-img info "$d/0003-incr.qcow2" | grep -q 'encrypted: yes' || check_fail "the incremental is not encrypted"

for n in 1 2 3; do bk_restores "$d" $n --key-file "$tmpdir/key"; done
st=0; bk restore "$d" "$tmpdir/nokey.img" || st=$?
bk_expect_status 2 "restore of an encrypted run without the key" 'encrypted: give its key with --key-file' "$st"
st=0; bk restore "$d" "$tmpdir/badkey.img" --key-file "$tmpdir/badkey" || st=$?
bk_expect_status 1 "restore with a wrong key" 'Invalid password' "$st"
[ ! -e "$tmpdir/nokey.img" ] && [ ! -e "$tmpdir/badkey.img" ] && ! ls "$tmpdir"/badkey.img.tmp* >/dev/null 2>&1 ||
    check_fail "a refused restore left a file"
st=0; bk -S "$ctl" -u "$origin" backup "$d" || st=$?
bk_expect_status 2 "an incremental of an encrypted chain without the key" 'encrypted' "$st"
st=0; bk verify "$d" --all --key-file "$tmpdir/badkey" || st=$?
bk_expect_status 1 "verify with a wrong key" 'Invalid password' "$st"
bk verify "$d" --all --key-file "$tmpdir/key" || check_fail "verify --all of the encrypted chain: $(cat "$tmpdir/bk.log")"
# prune commits an encrypted chain with the key; the points kept still
# restore, and later runs go on.
st=0; bk prune "$d" --keep-last 2 || st=$?
bk_expect_status 2 "prune of an encrypted chain without the key" 'encrypted: give its key' "$st"
bk prune "$d" --keep-last 2 --key-file "$tmpdir/key" || check_fail "prune of the encrypted chain: $(cat "$tmpdir/bk.log")"
for n in 2 3; do bk_restores "$d" $n --key-file "$tmpdir/key"; done
qemu-img info "$d/0001-full.qcow2" | grep -q 'encrypted: yes' || check_fail "the pruned full image is not encrypted"
write_random_blocks "$origin" 30 14 "$size"
bk_run "$d" 4 --key-file "$tmpdir/key"
bk_restores "$d" 4 --key-file "$tmpdir/key"
# qemu-img dies with the tool: a key file that is a FIFO nobody writes
# keeps qemu-img create waiting; SIGTERM stops it and the run cleans up,
# kill -9 of the tool takes it down too (PR_SET_PDEATHSIG).
mkfifo "$tmpdir/fifo-key"
for sig in TERM KILL; do
    "$SNAPFG_BACKUP" -S "$ctl" -u "$origin" backup "$tmpdir/fifo-$sig" --encrypt \
        --key-file "$tmpdir/fifo-key" >"$tmpdir/bk.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do
        child=$(pgrep -P "$pid" -x qemu-img || true)
        [ -n "$child" ] && break
        sleep 0.1
    done
    [ -n "$child" ] || { check_fail "SIG$sig: no qemu-img under the run: $(cat "$tmpdir/bk.log")"; continue; }
    kill -$sig "$pid"
    st=0; wait "$pid" 2>/dev/null || st=$?
    for _ in $(seq 100); do kill -0 "$child" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$child" 2>/dev/null; then
        check_fail "SIG$sig: qemu-img ($child) outlived snapfg-backup"
        kill -KILL "$child" 2>/dev/null || true
    else
        info "ok: SIG$sig: qemu-img does not outlive snapfg-backup"
    fi
    if [ $sig = TERM ]; then
        [ "$st" -eq 1 ] && [ -z "$(our_snapshots "$ctl")" ] && [ ! -e "$tmpdir/fifo-$sig" ] ||
            check_fail "SIGTERM during qemu-img: exit $st, snapshots '$(our_snapshots "$ctl")', $(ls -a "$tmpdir/fifo-$sig" 2>&1)"
    fi
done
for s in $(our_snapshots "$ctl"); do "$SNAPFGCTL" -S "$ctl" drop "$s" >/dev/null 2>&1 || true; done

st=0; bk -S "$ctl" -u "$origin" backup "$tmpdir/c-zstd" --encrypt --key-file "$tmpdir/key" || st=$?
bk_expect_status 2 "--encrypt on an unencrypted chain" 'not encrypted' "$st"
drop_our_checkpoints

stop_nbdkit "$pidf"
finish
