#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup serve on a qcow2 backup directory (REPO/NAME, made by
# backup REPO --disk NAME), against real nbdkit, qemu-nbd and clients:
#
#  1. the latest run and an older one (--at), each served on a Unix
#     socket and compared with its restore by qemu-img compare;
#  2. read-only by default: a write is refused;
#  3. --writable: writes are taken and read back, and thrown away at
#     exit (served again, the point is as it was);
#  4. files out of a served point: an ext4 file system made by mkfs
#     (with known files) is the origin; its served backup is read with
#     nbdfuse and mounted read-only (or, where the kernel cannot mount,
#     read with debugfs through the same nbdfuse file), and the files
#     match;
#  5. --limit-rate: a rate filter is in front (nbdkit's), the data the
#     same; --tcp serves on a port;
#  6. refusals: no -U/--tcp, both, no such disk or run, a server option
#     given to another command.
set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools
requires mkfs.ext4 debugfs

size=$((64 * 1024 * 1024))
backup_server "$size"
repo="$tmpdir/repo"

# start_serve NAME ARGS...: snapfg-backup serve ARGS in the background
# (it becomes nbdkit; cleaned up with the test's servers), waiting for
# $tmpdir/NAME.sock.  The socket is -U $tmpdir/NAME.sock.
start_serve() {
    local name=$1 s="$tmpdir/$1.sock" p
    shift
    rm -f "$s"
    "$SNAPFG_BACKUP" serve "$@" -U "$s" 2>"$tmpdir/$name.log" &
    p=$!
    _nbdkit_pids["$tmpdir/$name.pid"]=$p
    _nbdkit_logs["$tmpdir/$name.pid"]="$tmpdir/$name.log"
    echo "$p" >"$tmpdir/$name.pid"
    wait_until 30 test -S "$s" ||
        { cat "$tmpdir/$name.log" >&2; fail "serve $*: no socket $s"; }
}

# stop_serve NAME
stop_serve() {
    local p
    p=$(cat "$tmpdir/$1.pid")
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    unset "_nbdkit_pids[$tmpdir/$1.pid]"
}

served() { uri "$tmpdir/$1.sock"; }

# =====================================================================
info "=== 1. runs served and compared with their restores"
bk backup "$repo" --disk vda -S "$ctl" -u "$origin" ||
    { cat "$tmpdir/bk.log"; fail "backup 1 failed"; }
write_random_blocks "$origin" 64 1 "$size"
bk backup "$repo" --disk vda -S "$ctl" -u "$origin" ||
    { cat "$tmpdir/bk.log"; fail "backup 2 failed"; }
for n in 1 2; do
    bk restore "$repo" "$tmpdir/restored-$n.img" --disk vda --at "$n" ||
        { cat "$tmpdir/bk.log"; fail "restore --at $n failed"; }
done
cmp -s "$tmpdir/restored-1.img" "$tmpdir/restored-2.img" &&
    fail "runs 1 and 2 are the same: the test would prove nothing"

start_serve latest "$repo" --disk vda
grep -q "serving run 2 of $repo/vda (read-only)" "$tmpdir/latest.log" ||
    check_fail "serve's first line: $(cat "$tmpdir/latest.log")"
qemu-img compare -f raw -F raw "$(served latest)" "$tmpdir/restored-2.img" &&
    info "ok: the latest run served = its restore" ||
    check_fail "the latest run served differs from its restore"
start_serve at1 "$repo" --disk vda --at 1
qemu-img compare -f raw -F raw "$(served at1)" "$tmpdir/restored-1.img" &&
    info "ok: run 1 served = its restore" ||
    check_fail "run 1 served differs from its restore"
stop_serve at1

# =====================================================================
info "=== 2. read-only by default"
if "$PY" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
try:
    h.pwrite(b"x" * 512, 0)
except nbd.Error:
    sys.exit(0)
sys.exit(1)' "$(served latest)"; then
    info "ok: a write to the served point is refused"
else
    check_fail "a write to a read-only served point succeeded"
fi
stop_serve latest

# =====================================================================
info "=== 3. --writable: an overlay thrown away at exit"
start_serve rw "$repo" --disk vda --writable
grep -q "writable, writes thrown away at exit" "$tmpdir/rw.log" ||
    check_fail "serve --writable's first line: $(cat "$tmpdir/rw.log")"
"$PY" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\x5a" * 65536, 1048576); h.flush()
assert h.pread(65536, 1048576) == b"\x5a" * 65536
h.shutdown()' "$(served rw)" && info "ok: --writable takes writes and reads them back" ||
    check_fail "--writable: a write failed or did not read back"
stop_serve rw
start_serve rw2 "$repo" --disk vda --writable
qemu-img compare -f raw -F raw "$(served rw2)" "$tmpdir/restored-2.img" &&
    info "ok: the writes were thrown away at exit" ||
    check_fail "writes to --writable survived the server"
stop_serve rw2

# =====================================================================
info "=== 4. files out of a served point (nbdfuse, mount or debugfs)"
stop_nbdkit "$pidf"
fsdir="$tmpdir/files"
mkdir -p "$fsdir/etc"
echo "hello from the backup" >"$fsdir/hello.txt"
head -c 300000 /dev/urandom >"$fsdir/etc/blob.bin"
fsimg="$tmpdir/fs.img"
mkfs.ext4 -q -F -d "$fsdir" "$fsimg" 32M
start_snapfg "$tmpdir/fs.sock" "$tmpdir/fs.pid" origin="$fsimg" \
    state="$tmpdir/fs.state" control="$tmpdir/fs.ctl"
bk backup "$repo" --disk fs -S "$tmpdir/fs.ctl" -u "$(uri "$tmpdir/fs.sock")" ||
    { cat "$tmpdir/bk.log"; fail "backup of the ext4 disk failed"; }
start_serve fs "$repo" --disk fs
if have nbdfuse && [ -c /dev/fuse ]; then
    mkdir -p "$tmpdir/fuse" "$tmpdir/mnt"
    nbdfuse -r "$tmpdir/fuse/disk" "$(served fs)" &
    fuse_pid=$!
    on_exit "fusermount3 -u '$tmpdir/fuse' 2>/dev/null || umount '$tmpdir/fuse' 2>/dev/null; kill $fuse_pid 2>/dev/null"
    wait_until 20 test -s "$tmpdir/fuse/disk" || fail "nbdfuse did not show the disk"
    if mount -o ro,loop,noload "$tmpdir/fuse/disk" "$tmpdir/mnt" 2>"$tmpdir/mount.err"; then
        on_exit "umount '$tmpdir/mnt' 2>/dev/null"
        cmp "$tmpdir/mnt/hello.txt" "$fsdir/hello.txt" &&
        cmp "$tmpdir/mnt/etc/blob.bin" "$fsdir/etc/blob.bin" &&
            info "ok: the files of the mounted served point match" ||
            check_fail "files of the mounted served point differ"
        umount "$tmpdir/mnt"
    else
        info "mount not possible here ($(cat "$tmpdir/mount.err")): reading with debugfs"
        debugfs -R "dump /etc/blob.bin $tmpdir/blob.out" "$tmpdir/fuse/disk" 2>/dev/null
        debugfs -R "dump /hello.txt $tmpdir/hello.out" "$tmpdir/fuse/disk" 2>/dev/null
        cmp "$tmpdir/hello.out" "$fsdir/hello.txt" &&
        cmp "$tmpdir/blob.out" "$fsdir/etc/blob.bin" &&
            info "ok: the files read from the served point (debugfs) match" ||
            check_fail "files read from the served point differ"
    fi
    fusermount3 -u "$tmpdir/fuse" 2>/dev/null || umount "$tmpdir/fuse" 2>/dev/null || true
    wait "$fuse_pid" 2>/dev/null || true
else
    info "no nbdfuse or /dev/fuse: the files are read with debugfs from a copy"
    nbdcopy "$(served fs)" "$tmpdir/fs-copy.img"
    debugfs -R "dump /hello.txt $tmpdir/hello.out" "$tmpdir/fs-copy.img" 2>/dev/null
    cmp "$tmpdir/hello.out" "$fsdir/hello.txt" || check_fail "hello.txt differs"
fi
stop_serve fs

# =====================================================================
info "=== 5. --limit-rate and --tcp"
start_serve slow "$repo" --disk vda --limit-rate 32M
grep -q "rate limited" "$tmpdir/slow.log" || check_fail "no rate limit said"
qemu-img compare -f raw -F raw "$(served slow)" "$tmpdir/restored-2.img" &&
    info "ok: the rate-limited point = its restore" ||
    check_fail "the rate-limited point differs"
stop_serve slow
port=$((20000 + RANDOM % 20000))
"$SNAPFG_BACKUP" serve "$repo" --disk vda --tcp "$port" 2>"$tmpdir/tcp.log" &
tcp_pid=$!
_nbdkit_pids["$tmpdir/tcp.pid"]=$tcp_pid
if wait_until 30 nbdinfo --size "nbd://localhost:$port/" >/dev/null 2>&1; then
    qemu-img compare -f raw -F raw "nbd://localhost:$port/" "$tmpdir/restored-2.img" &&
        info "ok: --tcp serves the point" || check_fail "--tcp: the point differs"
else
    check_fail "--tcp $port: nothing listens ($(cat "$tmpdir/tcp.log"))"
fi
kill -TERM "$tcp_pid"; wait "$tcp_pid" 2>/dev/null || true
unset "_nbdkit_pids[$tmpdir/tcp.pid]"

# --limit-rate on backup and restore: the data is right and the copy
# is not faster than the rate (a lower bound on the time only: a loaded
# machine can make it slower, never faster; the accuracy is measured by
# contrib/bench/rate-bench.sh).
start_snapfg "$sock" "$pidf" origin="$disk" state="$tmpdir/disk.state" control="$ctl"
bk backup "$tmpdir/limited" -S "$ctl" -u "$origin" ||
    { cat "$tmpdir/bk.log"; fail "backup into limited failed"; }
fill_export "$origin" $((8 << 20)) $((4 << 20)) 0x21
t0=$(date +%s.%N)
bk backup "$tmpdir/limited" -S "$ctl" -u "$origin" --limit-rate 1M ||
    { cat "$tmpdir/bk.log"; fail "backup --limit-rate failed"; }
t1=$(date +%s.%N)
bk restore "$tmpdir/limited" "$tmpdir/limited.img" --limit-rate 32M ||
    { cat "$tmpdir/bk.log"; fail "restore --limit-rate failed"; }
t2=$(date +%s.%N)
nbdcopy "$origin" "$tmpdir/now.img"
cmp "$tmpdir/limited.img" "$tmpdir/now.img" && info "ok: --limit-rate: the data is right" ||
    check_fail "--limit-rate: the restore differs from the disk"
read_bytes=$(manifest_field "$tmpdir/limited" 2 bytes_read)
"$PY" -c '
import sys
t0, t1, t2, n = map(float, sys.argv[1:5])
# The incremental at 1 MiB/s, the restore of the 64 MiB at 32 MiB/s.
# A read starts once the bucket is above zero and is charged whole (the
# bucket goes into debt), so the last piece (256 KiB here) is read
# without waiting: a copy of n bytes takes at least (n - piece) / rate,
# less the bucket of a tenth of a second: half a second of slack at
# 1 MiB/s, a fifth at 32 MiB/s.
assert n >= 4 << 20, n
assert t1 - t0 >= n / (1 << 20) - 0.5, ("backup", t1 - t0, n)
assert t2 - t1 >= (64 << 20) / (32 << 20) - 0.2, ("restore", t2 - t1)
' "$t0" "$t1" "$t2" "$read_bytes" &&
    info "ok: --limit-rate: backup and restore no faster than the rate ($read_bytes bytes)" ||
    check_fail "--limit-rate: a copy was faster than the rate"

# =====================================================================
info "=== 6. refusals"
refused() {
    local what=$1 msg=$2 st=0
    shift 2
    bk "$@" || st=$?
    if [ "$st" -eq 2 ] || [ "$st" -eq 1 ]; then
        grep -qF -- "$msg" "$tmpdir/bk.log" && info "ok: $what: refused" ||
            check_fail "$what: message lacks '$msg': $(cat "$tmpdir/bk.log")"
    else
        check_fail "$what: exit $st, expected a refusal"
    fi
}
refused "no -U or --tcp" "either -U SOCKET or --tcp PORT" serve "$repo" --disk vda
refused "both -U and --tcp" "either -U SOCKET or --tcp PORT" serve "$repo" --disk vda -U "$tmpdir/x.sock" --tcp 1234
refused "no such disk" "has no disk nosuch" serve "$repo" --disk nosuch -U "$tmpdir/x.sock"
refused "no such run" "no run 9" serve "$repo" --disk vda --at 9 -U "$tmpdir/x.sock"
refused "a directory of disks without --disk" "--disk NAME" serve "$repo" -U "$tmpdir/x.sock"
refused "--writable on restore" "usage" restore "$repo" "$tmpdir/x.img" --disk vda --writable
refused "a bad --limit-rate" "--limit-rate" serve "$repo" --disk vda -U "$tmpdir/x.sock" --limit-rate 12Q
[ ! -e "$tmpdir/x.sock" ] || check_fail "a refused serve left a socket"

finish
