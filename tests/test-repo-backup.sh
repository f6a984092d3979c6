#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup into a repository (docs/repository.md): init, a full and
# incremental runs while a writer keeps writing, every point restored
# byte for byte (to a file and to an NBD export), incrementals that read
# only the chunks the checkpoint says changed, list's sizes, the
# server's snapshots and checkpoints after the runs, the checkpoints of
# directory repositories deleted by hand dropped, a disk whose size
# is not a multiple of the chunk size, and a backup DIR
# that is not a repository still taking the qcow2 chains.

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
require_backup_tools

CHUNK=$((4 * 1024 * 1024))
zero_16m_at_8m() {
    dd if=/dev/zero of="$1" bs=1M seek=8 count=16 conv=notrunc status=none
}
repo_server a $((64 * 1024 * 1024)) zero_16m_at_8m
repo=$(repo_loc main)

# --- init ------------------------------------------------------------------
rb init "$repo" || fail "init: $(cat "$tmpdir/rb.log")"
st=0; rb init "$repo" || st=$?
rb_expect 1 "init refuses an existing repository" "already a repository" "$st"
st=0; rb init "$tmpdir/x" --key-file /dev/null || st=$?
rb_expect 2 "init --key-file without --encrypt is a usage error" "without --encrypt" "$st"

# --- usage -----------------------------------------------------------------
for args in "backup $repo" "-S $ctl_a backup $repo --disk d" \
            "restore $repo $tmpdir/o" "list $repo extra" "prune $repo" \
            "-S $ctl_a -u $origin_a backup $repo --disk d --diff" \
            "restore $repo $tmpdir/o --disk d --all"; do
    st=0
    # shellcheck disable=SC2086
    rb $args || st=$?
    [ "$st" -eq 2 ] || check_fail "snapfg-backup $args: exit $st, expected 2: $(cat "$tmpdir/rb.log")"
done
st=0; rb -S "$ctl_a" -u "$origin_a" backup "$repo" --disk 'bad/name' || st=$?
rb_expect 2 "a disk name with a slash is refused" "disk's name" "$st"

# --- runs while the writer writes ------------------------------------------
# The writer is paused while the origin is saved; it resumes once the
# run's snapshot exists, so it writes during the copy too.
backup_with_writer() {
    local n=$1 pid st=0
    shift
    writer_pause
    save_origin "$origin_a" "$tmpdir/expect-d1-$n.img"
    timeout 600 "$SNAPFG_BACKUP" -S "$ctl_a" -u "$origin_a" --json backup \
        "$repo" --disk d1 "$@" >"$tmpdir/run-d1-$n.json" 2>"$tmpdir/rb.log" &
    pid=$!
    for _ in $(seq 600); do
        [ -n "$(repo_snapshots "$ctl_a")" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    writer_resume
    wait "$pid" || st=$?
    [ "$st" -eq 0 ] || { cat "$tmpdir/rb.log" "$tmpdir/run-d1-$n.json" >&2; fail "run $n exited $st"; }
    info "run $n: $(cat "$tmpdir/run-d1-$n.json")"
}
writer_chunks() {
    awk -v p="$1" -v c="$CHUNK" '$1 == p {
        for (k = int($2 / c); k * c < $2 + $3; k++) seen[k] = 1
    } END { n = 0; for (k in seen) n++; print n }' "$_writer_dir/writes.log"
}

# Run 1 before the writer starts: the zero chunks are still zero.
rb_run "$repo" d1 a 1
WRITER_SEED=7 writer_start "$origin_a" "$size"
sleep 0.5
for n in 2 3 4; do
    backup_with_writer $n
    sleep 0.3
done
writer_stop
# What the writer wrote during and after run 4.
rb_run "$repo" d1 a 5

[ "$(run_field d1 1 type)" = full ] || check_fail "run 1 is not full"
[ "$(run_field d1 1 chunks_zero)" -ge 4 ] ||
    check_fail "run 1 found $(run_field d1 1 chunks_zero) zero chunks (16 MiB are zero)"
for n in 3 4; do
    [ "$(run_field d1 $n type)" = incremental ] || check_fail "run $n is not incremental"
    [ "$(run_field d1 $n run)" = $n ] || check_fail "run $n is numbered $(run_field d1 $n run)"
    want=$(( $(writer_chunks $((n - 1))) * CHUNK ))
    got=$(run_field d1 $n bytes_read)
    if [ "$got" -eq "$want" ] && [ "$got" -gt 0 ]; then
        info "ok: run $n read $got bytes: the chunks written since run $((n - 1))"
    else
        check_fail "run $n read $got bytes; the writer changed $want bytes of chunks"
    fi
done

# --- incremental: only what changed ------------------------------------------
# Two chunks changed, nothing else: the run reads and stores two chunks.
"$PY" - "$origin_a" <<'PYEOF'
import nbd, os, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(os.urandom(65536), 40 << 20)
h.pwrite(os.urandom(4096), (52 << 20) + 8192)
h.shutdown()
PYEOF
rb_run "$repo" d1 a 6
[ "$(run_field d1 6 bytes_read)" -eq $((2 * CHUNK)) ] &&
[ "$(run_field d1 6 chunks_added)" -eq 2 ] ||
    check_fail "run 6 read $(run_field d1 6 bytes_read) bytes and added $(run_field d1 6 chunks_added) chunks; 2 chunks changed"
# Nothing changed: nothing read, a point all the same.
rb_run "$repo" d1 a 7
[ "$(run_field d1 7 bytes_read)" -eq 0 ] && [ "$(run_field d1 7 bytes_added)" -eq 0 ] ||
    check_fail "run 7 read $(run_field d1 7 bytes_read) bytes with nothing changed"
# --full reads everything and stores nothing new.
rb_run "$repo" d1 a 8 --full
[ "$(run_field d1 8 type)" = full ] && [ "$(run_field d1 8 bytes_added)" -eq 0 ] ||
    check_fail "run 8 (--full, nothing changed) added $(run_field d1 8 bytes_added) bytes"

# --- the server after the runs -------------------------------------------------
[ -z "$(repo_snapshots "$ctl_a")" ] || check_fail "snapshots left: $(repo_snapshots "$ctl_a")"
[ "$(repo_checkpoints "$ctl_a" | wc -l)" -eq 1 ] ||
    check_fail "checkpoints on the server: $(repo_checkpoints "$ctl_a") (expected the last run's)"

# --- every point ------------------------------------------------------------
for n in 1 2 3 4 5 6 7 8; do
    rb_restores "$repo" d1 $n
done
rb restore "$repo" "$tmpdir/latest.img" --disk d1 && cmp "$tmpdir/latest.img" "$tmpdir/expect-d1-8.img" ||
    check_fail "restore without --at is not the latest run"
st=0; rb restore "$repo" "$tmpdir/latest.img" --disk d1 || st=$?
rb_expect 1 "restore never overwrites a file" "never overwrites" "$st"
cmp "$tmpdir/latest.img" "$tmpdir/expect-d1-8.img" || check_fail "a refused restore changed the file"
# To an NBD export (a plain nbdkit memory disk, then read back).
start_nbdkit_plain() {
    nbdkit -f --exit-with-parent -U "$tmpdir/mem.sock" -P "$tmpdir/mem.pid" memory "$size" 2>/dev/null &
    for _ in $(seq 100); do [ -S "$tmpdir/mem.sock" ] && return 0; sleep 0.1; done
    fail "nbdkit memory did not start"
}
start_nbdkit_plain
if rb restore "$repo" "$(uri "$tmpdir/mem.sock")" --disk d1 --at 2; then
    nbdcopy "$(uri "$tmpdir/mem.sock")" "$tmpdir/from-nbd.img"
    cmp "$tmpdir/from-nbd.img" "$tmpdir/expect-d1-2.img" && info "ok: restore to an NBD URI" ||
        check_fail "restore to an NBD URI differs"
else
    check_fail "restore to an NBD URI: $(cat "$tmpdir/rb.log")"
fi
kill "$(cat "$tmpdir/mem.pid")" 2>/dev/null || true

# --- list ----------------------------------------------------------------------
[ "$(repo_json "$repo" 'len(j["disks"][0]["runs"])')" -eq 8 ] || check_fail "list shows $(repo_json "$repo" 'len(j["disks"][0]["runs"])') runs"
[ "$(repo_json "$repo" 'j["logical_bytes"]')" -eq $((8 * size)) ] || check_fail "list: logical bytes"
stored=$(repo_json "$repo" 'j["stored_bytes"]')
added=$(repo_json "$repo" 'sum(r["bytes_added"] for r in j["disks"][0]["runs"])')
[ "$stored" -eq "$added" ] || check_fail "list: stored $stored bytes, the runs added $added"
if repo_is_dir; then
    du=$(find "$repo/chunks" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
    [ "$du" -eq "$stored" ] || check_fail "list says $stored bytes stored, the chunk files hold $du"
fi
rb list "$repo" --disk d1 && grep -q '^  8 .*full' "$tmpdir/rb.log" || check_fail "list's table: $(cat "$tmpdir/rb.log")"

# --- checkpoints of repositories deleted by hand ------------------------------
# A run drops the server's checkpoints made on this host for a directory
# repository that is gone or now holds another repository (the chains'
# D12); one whose directory is there without a repository (a file system
# not mounted yet) keeps its checkpoint, as does a repository still there.
if repo_is_dir; then
    ckpt_of() {   # REPO: its checkpoint on the server (one run, one disk)
        local id
        id=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"][:8])' "$1/config")
        repo_checkpoints "$ctl_a" | grep "^snapfg-repo-$id-" || true
    }
    other_run() {   # REPO
        rb -S "$ctl_a" -u "$origin_a" backup "$1" --disk o ||
            fail "backup into $1: $(cat "$tmpdir/rb.log")"
    }
    for r in gone renewed unmounted kept; do
        rb init "$tmpdir/$r" || fail "init $r: $(cat "$tmpdir/rb.log")"
        other_run "$tmpdir/$r"
        printf -v "ck_$r" '%s' "$(ckpt_of "$tmpdir/$r")"
    done
    [ -n "$ck_gone" ] && [ -n "$ck_renewed" ] && [ -n "$ck_unmounted" ] && [ -n "$ck_kept" ] ||
        fail "the runs left no checkpoints: $(repo_checkpoints "$ctl_a")"
    rm -rf "$tmpdir/gone"
    rm -rf "$tmpdir/renewed"
    rb init "$tmpdir/renewed" || fail "init renewed: $(cat "$tmpdir/rb.log")"
    mv "$tmpdir/unmounted" "$tmpdir/unmounted.away"
    mkdir "$tmpdir/unmounted"
    save_origin "$origin_a" "$tmpdir/expect-d1-9.img"
    rb -S "$ctl_a" -u "$origin_a" backup "$repo" --disk d1 ||
        fail "backup: $(cat "$tmpdir/rb.log")"
    for c in "$ck_gone" "$ck_renewed"; do
        repo_checkpoints "$ctl_a" | grep -qx "$c" &&
            check_fail "the checkpoint $c of a repository deleted by hand is still on the server"
        grep -q "dropped checkpoint $c (made for $(hostname):$tmpdir/" "$tmpdir/rb.log" ||
            check_fail "the run does not say it dropped $c: $(cat "$tmpdir/rb.log")"
    done
    for c in "$ck_unmounted" "$ck_kept"; do
        repo_checkpoints "$ctl_a" | grep -qx "$c" ||
            check_fail "a run dropped the checkpoint $c of a repository that may still be there"
    done
    # The checkpoint the kept repository's next run starts from is there.
    mv "$tmpdir/unmounted.away"/* "$tmpdir/unmounted/"
    rb --json -S "$ctl_a" -u "$origin_a" backup "$tmpdir/unmounted" --disk o ||
        fail "backup into unmounted: $(cat "$tmpdir/rb.log")"
    grep -q '"type":"incremental"' "$tmpdir/rb.log" ||
        check_fail "the run after the remount was not incremental: $(cat "$tmpdir/rb.log")"
    rb_restores "$repo" d1 9
    # --json lists what it dropped.
    rm -rf "$tmpdir/kept"
    rb_run "$repo" d1 a 10
    [ "$(run_field d1 10 dropped_checkpoints)" = "['$ck_kept']" ] ||
        check_fail "--json's dropped_checkpoints: $(cat "$tmpdir/run-d1-10.json")"
fi

# --- a backup DIR that is not a repository keeps the qcow2 chains ---------
bk -S "$ctl_a" -u "$origin_a" backup "$tmpdir/chain" || fail "qcow2 backup: $(cat "$tmpdir/bk.log")"
[ -f "$tmpdir/chain/manifest.json" ] && ls "$tmpdir/chain" | grep -q '0001-full.qcow2' ||
    check_fail "backup DIR did not make a qcow2 chain: $(ls "$tmpdir/chain")"
[ ! -e "$tmpdir/chain/config" ] || check_fail "the qcow2 chain directory got a repository config"

# --- a disk whose size is not a multiple of the chunk size -------------------
repo_server c $((10 * 1024 * 1024 + 12288))
rb_run "$repo" odd c 1 --compress
"$PY" - "$origin_c" "$size" <<'PYEOF'
import nbd, os, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1]); s = int(sys.argv[2])
h.pwrite(os.urandom(4096), s - 4096)
h.shutdown()
PYEOF
rb_run "$repo" odd c 2 --compress
[ "$(run_field odd 2 bytes_read)" -eq $((size - 8 * 1024 * 1024)) ] ||
    check_fail "odd-sized disk: run 2 read $(run_field odd 2 bytes_read) bytes (only the short last chunk changed)"
rb_restores "$repo" odd 1
rb_restores "$repo" odd 2

finish
