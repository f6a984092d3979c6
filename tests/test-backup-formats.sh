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

size=$((16 * 1024 * 1024))
disk="$tmpdir/disk.img"
sock="$tmpdir/sock"
ctl="$tmpdir/ctl"
pidf="$tmpdir/nbdkit.pid"
make_random_image "$disk" "$size"
# Half the disk compressible (a repeated pattern), some of it zero.
"$PY" - "$disk" <<'PYEOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(2 << 20)
    f.write(b"snapfg-backup compresses this. " * ((8 << 20) // 31))
    f.seek(12 << 20)
    f.write(bytes(2 << 20))
PYEOF
start_snapfg "$sock" "$pidf" origin="$disk" state="$tmpdir/disk.state" \
    control="$ctl"
require_checkpoints "$ctl"
origin=$(uri "$sock")
# A key derivation of 10 ms, not 2 s (each image opened derives it).
export SNAPFG_BACKUP_TEST_LUKS_ITER_TIME=10

expect_status() {               # expect_status N WHAT GREP ST
    local want=$1 what=$2 pat=$3 st=$4
    if [ "$st" -eq "$want" ] && grep -q -- "$pat" "$tmpdir/bk.log"; then
        info "ok: $what"
    else
        check_fail "$what: exit $st (expected $want, '$pat'): $(cat "$tmpdir/bk.log")"
    fi
}
# run DIR N [ARGS]: save the origin as expect-DIR-N, back up, then change
# 30 blocks.
run() {
    local d=$1 n=$2
    shift 2
    save_origin "$origin" "$tmpdir/expect-$(basename "$d")-$n.img"
    bk -S "$ctl" -u "$origin" backup "$d" "$@" ||
        { cat "$tmpdir/bk.log" >&2; fail "backup $d run $n ($*) failed"; }
    info "$(basename "$d") run $n: $(tail -n 1 "$tmpdir/bk.log")"
}
restores() {                    # restores DIR N [ARGS]
    local d=$1 n=$2 out="$tmpdir/r-$RANDOM.img"
    shift 2
    if bk restore "$d" "$out" --at "$n" "$@" &&
       cmp "$out" "$tmpdir/expect-$(basename "$d")-$n.img"; then
        info "ok: $(basename "$d") run $n restores exactly"
    else
        check_fail "restore of $(basename "$d") run $n: $(cat "$tmpdir/bk.log")"
    fi
    rm -f "$out"
}
drop_chain_checkpoints() {
    for c in $(our_checkpoints "$ctl"); do
        "$SNAPFGCTL" -S "$ctl" checkpoint drop "$c" >/dev/null 2>&1 || true
    done
}
compressed_clusters() {         # the percentage qemu-img check reports
    qemu-img check "$@" 2>/dev/null | sed -n 's/.* \([0-9.]*\)% compressed clusters.*/\1/p'
}

# --- compression: zstd and zlib, full and incremental -----------------------
for algo in zstd zlib; do
    d="$tmpdir/c-$algo"
    run "$d" 1 --compress=$algo
    write_random_blocks "$origin" 30 11 "$size"
    run "$d" 2 --compress=$algo
    for n in 1 2; do restores "$d" $n; done
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
    drop_chain_checkpoints
done
st=0; bk -S "$ctl" -u "$origin" backup "$tmpdir/c-x" --compress=lz4 || st=$?
[ "$st" -eq 2 ] || check_fail "--compress=lz4: exit $st, expected 2"

# --- encryption --------------------------------------------------------------
d="$tmpdir/enc"
printf 'correct horse battery staple' >"$tmpdir/key"
printf 'wrong' >"$tmpdir/badkey"
st=0; bk -S "$ctl" -u "$origin" backup "$d" --encrypt || st=$?
expect_status 2 "--encrypt without --key-file" 'key-file' "$st"
run "$d" 1 --encrypt --key-file "$tmpdir/key" --compress
write_random_blocks "$origin" 30 12 "$size"
run "$d" 2 --key-file "$tmpdir/key"
write_random_blocks "$origin" 30 13 "$size"
run "$d" 3 --key-file "$tmpdir/key"
qemu-img info "$d/0001-full.qcow2" | grep -q 'encrypted: yes' || check_fail "the full image is not encrypted"
qemu-img info "$d/0003-incr.qcow2" | grep -q 'encrypted: yes' || check_fail "the incremental is not encrypted"

for n in 1 2 3; do restores "$d" $n --key-file "$tmpdir/key"; done
st=0; bk restore "$d" "$tmpdir/nokey.img" || st=$?
expect_status 1 "restore of an encrypted run without the key" 'encrypted: give its key with --key-file' "$st"
st=0; bk restore "$d" "$tmpdir/badkey.img" --key-file "$tmpdir/badkey" || st=$?
expect_status 1 "restore with a wrong key" 'Invalid password' "$st"
[ ! -e "$tmpdir/nokey.img" ] && [ ! -e "$tmpdir/badkey.img" ] && ! ls "$tmpdir"/badkey.img.tmp* >/dev/null 2>&1 ||
    check_fail "a refused restore left a file"
st=0; bk -S "$ctl" -u "$origin" backup "$d" || st=$?
expect_status 2 "an incremental of an encrypted chain without the key" 'encrypted' "$st"
st=0; bk verify "$d" --all --key-file "$tmpdir/badkey" || st=$?
expect_status 1 "verify with a wrong key" 'Invalid password' "$st"
bk verify "$d" --all --key-file "$tmpdir/key" || check_fail "verify --all of the encrypted chain: $(cat "$tmpdir/bk.log")"
# prune commits an encrypted chain with the key; the points kept still
# restore, and later runs go on.
st=0; bk prune "$d" --keep-last 2 || st=$?
expect_status 1 "prune of an encrypted chain without the key" 'encrypted: give its key' "$st"
bk prune "$d" --keep-last 2 --key-file "$tmpdir/key" || check_fail "prune of the encrypted chain: $(cat "$tmpdir/bk.log")"
for n in 2 3; do restores "$d" $n --key-file "$tmpdir/key"; done
qemu-img info "$d/0001-full.qcow2" | grep -q 'encrypted: yes' || check_fail "the pruned full image is not encrypted"
write_random_blocks "$origin" 30 14 "$size"
run "$d" 4 --key-file "$tmpdir/key"
restores "$d" 4 --key-file "$tmpdir/key"
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
expect_status 2 "--encrypt on an unencrypted chain" 'not encrypted' "$st"
drop_chain_checkpoints

stop_nbdkit "$pidf"
finish
