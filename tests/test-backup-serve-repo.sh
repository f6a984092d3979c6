#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A point of a backup repository served (snapfg-backup serve REPO --disk
# NAME, which runs nbdkit with plugins/snapfg-repo), against real nbdkit
# and clients:
#
#  1. a 1 GiB disk (random data in a few places, the rest zero) backed
#     up twice; each run served and compared with its restore by
#     qemu-img compare; read-only; --writable takes writes and forgets
#     them at exit;
#  2. reads fetch only what they touch: with the plugin under nbdkit -v,
#     every chunk fetched is a debug line: a read in each of three data
#     chunks fetches exactly three chunks, reading them again fetches
#     none (the cache), reading zero chunks fetches none, and the
#     extents show the zero chunks as holes.
set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools
plugin=${SNAPFG_REPO_PLUGIN:-}
[ -n "$plugin" ] && [ -f "$plugin" ] ||
    skip "the snapfg-repo plugin is not built (no src/repo/ in this tree)"

size=$((1024 * 1024 * 1024))
disk="$tmpdir/disk.img"
truncate -s "$size" "$disk"
"$PY" - "$disk" <<'PYEOF'
import os, sys
f = open(sys.argv[1], "r+b")
for off in (0, 300 << 20, 700 << 20, (1024 << 20) - (1 << 20)):
    f.seek(off); f.write(os.urandom(1 << 20))
PYEOF
start_snapfg "$tmpdir/sock" "$tmpdir/nbdkit.pid" origin="$disk" \
    state="$tmpdir/disk.state" control="$tmpdir/ctl"
require_checkpoints "$tmpdir/ctl"
origin=$(uri "$tmpdir/sock")
repo="$tmpdir/repo"
bk init "$repo" || { cat "$tmpdir/bk.log"; fail "init failed"; }
bk backup "$repo" --disk vda -S "$tmpdir/ctl" -u "$origin" ||
    { cat "$tmpdir/bk.log"; fail "backup 1 failed"; }
fill_export "$origin" $((500 << 20)) 65536 0x77
bk backup "$repo" --disk vda -S "$tmpdir/ctl" -u "$origin" ||
    { cat "$tmpdir/bk.log"; fail "backup 2 failed"; }
for n in 1 2; do
    bk restore "$repo" "$tmpdir/r$n.img" --disk vda --at "$n" ||
        { cat "$tmpdir/bk.log"; fail "restore --at $n failed"; }
done

# serve_start NAME ARGS...: snapfg-backup serve in the background.
serve_start() {
    local name=$1 p
    shift
    rm -f "$tmpdir/$name.sock"
    "$SNAPFG_BACKUP" serve "$repo" --disk vda -U "$tmpdir/$name.sock" "$@" \
        2>"$tmpdir/$name.log" &
    p=$!
    _nbdkit_pids["$tmpdir/$name.pid"]=$p
    _nbdkit_logs["$tmpdir/$name.pid"]="$tmpdir/$name.log"
    echo "$p" >"$tmpdir/$name.pid"
    wait_until 30 test -S "$tmpdir/$name.sock" ||
        { cat "$tmpdir/$name.log" >&2; fail "serve $*: no socket"; }
}
serve_stop() {
    kill -TERM "$(cat "$tmpdir/$1.pid")" 2>/dev/null || true
    wait "$(cat "$tmpdir/$1.pid")" 2>/dev/null || true
    unset "_nbdkit_pids[$tmpdir/$1.pid]"
}

# =====================================================================
info "=== 1. each run served = its restore"
export SNAPFG_REPO_PLUGIN="$plugin"
serve_start latest
qemu-img compare -f raw -F raw "$(uri "$tmpdir/latest.sock")" "$tmpdir/r2.img" &&
    info "ok: the latest point served = its restore" ||
    check_fail "the latest point served differs from its restore"
if "$PY" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
try:
    h.pwrite(b"x" * 512, 0)
except nbd.Error:
    sys.exit(0)
sys.exit(1)' "$(uri "$tmpdir/latest.sock")"; then
    info "ok: read-only"
else
    check_fail "a write to the served repository point succeeded"
fi
serve_stop latest
serve_start at1 --at 1
qemu-img compare -f raw -F raw "$(uri "$tmpdir/at1.sock")" "$tmpdir/r1.img" &&
    info "ok: run 1 served = its restore" || check_fail "run 1 served differs"
serve_stop at1
serve_start rw --writable
"$PY" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\x5a" * 65536, 0); h.flush()
assert h.pread(65536, 0) == b"\x5a" * 65536
h.shutdown()' "$(uri "$tmpdir/rw.sock")" && info "ok: --writable takes writes" ||
    check_fail "--writable: the write failed"
serve_stop rw
serve_start rw2 --writable
qemu-img compare -f raw -F raw "$(uri "$tmpdir/rw2.sock")" "$tmpdir/r2.img" &&
    info "ok: the writes were thrown away at exit" ||
    check_fail "writes to --writable survived"
serve_stop rw2

# =====================================================================
info "=== 2. reads fetch only the chunks they touch"
rm -f "$tmpdir/count.sock"
nbdkit -f -v -U "$tmpdir/count.sock" -P "$tmpdir/count.pid" "$plugin" \
    repo="$repo" disk=vda 2>"$tmpdir/count.log" &
_nbdkit_pids["$tmpdir/count.pid"]=$!
wait_until 30 test -S "$tmpdir/count.sock" || fail "the plugin did not start"
fetched() { grep -c "fetched chunk" "$tmpdir/count.log" || true; }
[ "$(fetched)" = 0 ] || check_fail "chunks fetched before any read"
"$PY" - "$(uri "$tmpdir/count.sock")" "$tmpdir" <<'PYEOF'
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
want = open(sys.argv[2] + "/r2.img", "rb")
def check(off, n):
    want.seek(off)
    assert h.pread(n, off) == want.read(n), off
for off in (4096, (300 << 20) + 12345, (700 << 20) + 999):
    check(off, 4096)
open(sys.argv[2] + "/phase1", "w").close()
import time
for off in (8192, (300 << 20) + 65536, (700 << 20) + 4096):
    check(off, 4096)
open(sys.argv[2] + "/phase2", "w").close()
for off in (100 << 20, 800 << 20, 200 << 20):
    check(off, 65536)
h.shutdown()
PYEOF
sleep 1
n=$(fetched)
[ "$n" = 3 ] && info "ok: 9 reads over 3 data chunks (3 of them again) and zero chunks fetched $n chunks of a 1 GiB point" ||
    { grep "fetched chunk" "$tmpdir/count.log" >&2; check_fail "$n chunks fetched, expected 3"; }
nbdinfo --map "$(uri "$tmpdir/count.sock")" >"$tmpdir/map" 2>&1
grep -q "hole,zero" "$tmpdir/map" && info "ok: zero chunks are holes in the extents" ||
    { cat "$tmpdir/map"; check_fail "no hole in the extents"; }
finish
