# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Helpers for the snapfg-backup tests (test-backup*.sh), on top of
# control-functions.sh:
#
#   source "$(dirname "$0")/backup-functions.sh"
#
# Provides $SNAPFG_BACKUP (the built tool) and:
#
#   require_backup_tools      nbdkit, plugin, snapfgctl, snapfg-backup,
#                             qemu-img, qemu-nbd, nbdcopy, a Python with nbd
#   require_checkpoints SOCK  skip unless the server knows checkpoints
#   bk ARGS...                run snapfg-backup ARGS (timeout 600 s);
#                             stdout+stderr in $tmpdir/bk.log; returns its
#                             exit status
#   writer_start URI SIZE     start tests/backup-writer.py on URI
#   writer_pause, writer_resume, writer_stop
#   writer_granules PHASE     distinct 64K granules written in PHASE
#   save_origin URI FILE      copy the origin (writer paused) to FILE
#   backup_during_writes EXPECT SOCK URI DIR [ARGS...]
#                             pause the writer, save the origin to EXPECT,
#                             start a backup, resume the writer as soon as
#                             the run's snapshot exists, wait for the run;
#                             returns its exit status
#   manifest_field DIR SEQ KEY  a field of run SEQ in DIR/manifest.json
#   chain_checkpoints DIR     the checkpoints DIR's chain keeps on the
#                             server (the last run's and the latest full
#                             run's), sorted, one a line
#   restore_equals DIR N FILE WHAT  restore run N (raw) and cmp with FILE
#   our_snapshots SOCK, our_checkpoints SOCK   names starting snapfg-backup-
#   write_random_blocks URI N SEED SIZE  N random 4K-aligned writes
#   backup_server SIZE [PREPARE]  a random origin served with a state file
#                             and a control socket (see below)
#   make_compressible FILE    part of FILE a pattern, part zeroes
#   bk_run, bk_restores, bk_expect_status, drop_our_checkpoints
#                             a chain's runs and restores (see below)

# shellcheck shell=bash

_bfn_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=control-functions.sh
source "$_bfn_dir/control-functions.sh"

if [ -z "${SNAPFG_BACKUP:-}" ]; then
    SNAPFG_BACKUP=$(_find_first \
        "$PWD/tools/snapfg-backup/snapfg-backup" \
        "$PWD/../tools/snapfg-backup/snapfg-backup" \
        "$_bfn_dir/../tools/snapfg-backup/snapfg-backup") || true
fi
BACKUP_WRITER="$_bfn_dir/backup-writer.py"

require_backup_tools() {
    require_control_tools
    requires qemu-img qemu-nbd
    [ -n "$SNAPFG_BACKUP" ] && [ -x "$SNAPFG_BACKUP" ] ||
        fail "snapfg-backup not found (SNAPFG_BACKUP='${SNAPFG_BACKUP:-}'): run 'make tools/snapfg-backup/snapfg-backup' first"
}

require_checkpoints() {
    if ! "$SNAPFGCTL" -S "$1" --json checkpoint list >/dev/null 2>&1; then
        skip "the server has no checkpoints (checkpoint list refused)"
    fi
}

bk() {
    local st=0
    timeout 600 "$SNAPFG_BACKUP" "$@" >"$tmpdir/bk.log" 2>&1 || st=$?
    [ "$st" -ne 124 ] || echo "snapfg-backup $* timed out (600 s)" >>"$tmpdir/bk.log"
    return "$st"
}

_writer_pid=
_writer_dir=
writer_start() {
    _writer_dir="$tmpdir/writer"
    mkdir -p "$_writer_dir"
    rm -f "$_writer_dir/pause" "$_writer_dir/paused" "$_writer_dir/stop"
    "$PY" "$BACKUP_WRITER" "$1" "$_writer_dir" "$2" "${WRITER_SEED:-$$}" \
        2>"$_writer_dir/stderr" &
    _writer_pid=$!
    on_exit 'writer_stop_quietly'
}

writer_pause() {
    touch "$_writer_dir/pause"
    for _ in $(seq 600); do
        [ -e "$_writer_dir/paused" ] && return 0
        kill -0 "$_writer_pid" 2>/dev/null ||
            { cat "$_writer_dir/stderr" >&2; fail "the writer died"; }
        sleep 0.1
    done
    fail "the writer did not pause within 60 s"
}

writer_resume() { rm -f "$_writer_dir/pause"; }

writer_stop() {
    [ -n "$_writer_pid" ] || return 0
    touch "$_writer_dir/stop"
    rm -f "$_writer_dir/pause"
    local st=0
    wait "$_writer_pid" || st=$?
    _writer_pid=
    if [ "$st" -ne 0 ]; then
        cat "$_writer_dir/stderr" >&2
        fail "the writer exited with status $st"
    fi
}

writer_stop_quietly() {
    [ -n "$_writer_pid" ] || return 0
    touch "$_writer_dir/stop"
    rm -f "$_writer_dir/pause"
    wait "$_writer_pid" 2>/dev/null
    _writer_pid=
}

# The writer's phase while paused (the number of resumes so far).
writer_phase() { cat "$_writer_dir/paused"; }

writer_granules() {
    awk -v p="$1" '$1 == p {
        for (g = int($2 / 65536); g * 65536 < $2 + $3; g++) seen[g] = 1
    } END { n = 0; for (g in seen) n++; print n }' "$_writer_dir/writes.log"
}

save_origin() {
    nbdcopy "$1" "$2" || fail "nbdcopy $1 $2 failed"
}

# our_snapshots SOCK, our_checkpoints SOCK: the snapshots / checkpoints
# snapfg-backup made (named snapfg-backup-...), one a line.  Tests pipe
# them into grep -q, which stops reading at its first match: the names
# are written at once, and a reader gone is not an error (under
# pipefail, a BrokenPipeError here failed a check whose grep had
# matched).
our_snapshots() { _names_with_prefix snapfg-backup- "$1" snapshots list; }
our_checkpoints() { _names_with_prefix snapfg-backup- "$1" checkpoints checkpoint list; }
# _names_with_prefix PREFIX SOCK KEY SNAPFGCTL-ARGS...: the names in
# KEY of snapfgctl's --json answer that start with PREFIX, one a line
# (repo-functions.sh's repo_snapshots and repo_checkpoints use it too).
_names_with_prefix() {
    local prefix=$1 sock=$2 key=$3
    shift 3
    "$SNAPFGCTL" -S "$sock" --json "$@" |
        "$PY" -c 'import json, os, sys
try:
    items = json.load(sys.stdin)[sys.argv[1]]
    out = "".join(x["name"] + "\n" for x in items
                  if x["name"].startswith(sys.argv[3]))
except Exception as e:
    out = "(snapfgctl %s failed: %s)\n" % (sys.argv[2], e)
try:
    os.write(1, out.encode())
except BrokenPipeError:
    pass' "$key" "$*" "$prefix"
}

# write_random_blocks URI N SEED SIZE: N acknowledged random writes
# (4K to 32K, 4K-aligned, no flush) into an export of SIZE bytes.
write_random_blocks() {
    "$PY" - "$@" <<'EOF'
import nbd, os, random, sys
uri, n, seed, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(uri)
for _ in range(n):
    length = rng.randrange(1, 9) * 4096
    off = rng.randrange((size - length) // 4096 + 1) * 4096
    h.pwrite(os.urandom(length), off)
h.shutdown()
EOF
}

backup_during_writes() {
    local expect=$1 sock=$2 uri=$3 dir=$4 pid st=0
    shift 4
    writer_pause
    save_origin "$uri" "$expect"
    timeout 600 "$SNAPFG_BACKUP" -S "$sock" -u "$uri" backup "$dir" "$@" \
        >"$tmpdir/bk.log" 2>&1 &
    pid=$!
    # The snapshot's instant is the moment it is listed; the writer
    # resumes then, and writes on during the copy.
    for _ in $(seq 600); do
        [ -n "$(our_snapshots "$sock")" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    writer_resume
    wait "$pid" || st=$?
    return "$st"
}

manifest_field() {
    "$PY" -c 'import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
r = [r for r in m["runs"] if r["seq"] == int(sys.argv[2])]
print(r[0][sys.argv[3]] if r else "")' "$1" "$2" "$3"
}

chain_checkpoints() {
    "$PY" -c 'import json, sys
runs = json.load(open(sys.argv[1] + "/manifest.json"))["runs"]
keep = set()
if runs:
    keep.add(runs[-1]["checkpoint"])
fulls = [r for r in runs if r.get("type") == "full"]
if fulls:
    keep.add(fulls[-1].get("diff_checkpoint") or fulls[-1]["checkpoint"])
print("\n".join(sorted(keep)))' "$1"
}

restore_equals() {
    local dir=$1 n=$2 file=$3 what=$4 out="$tmpdir/restored-$RANDOM.img"
    if ! bk restore "$dir" "$out" --at "$n"; then
        cat "$tmpdir/bk.log" >&2
        check_fail "$what: restore --at $n failed"
        return 0
    fi
    if cmp "$out" "$file" >/dev/null; then
        info "ok: $what"
    else
        cmp "$out" "$file" | head -3 >&2
        check_fail "$what: restored run $n differs from the origin at its instant"
    fi
    rm -f "$out"
}

# backup_server SIZE [PREPARE]: a random origin of SIZE bytes, made
# ready by the function PREPARE (given the file) if named, served by
# snapfg with a state file and a control socket.  Sets size, disk, sock,
# ctl (the control socket), pidf, dir (a backup directory, not made) and
# origin (the origin's URI).
backup_server() {
    size=$1
    disk="$tmpdir/disk.img"
    sock="$tmpdir/sock"
    ctl="$tmpdir/ctl"
    pidf="$tmpdir/nbdkit.pid"
    dir="$tmpdir/backups"
    make_random_image "$disk" "$size"
    [ -z "${2:-}" ] || "$2" "$disk"
    start_snapfg "$sock" "$pidf" origin="$disk" \
        state="$tmpdir/disk.state" control="$ctl"
    require_checkpoints "$ctl"
    origin=$(uri "$sock")
}

# make_compressible FILE: 8 MiB of a repeated pattern at 2 MiB and 2 MiB
# of zeroes at 12 MiB (FILE is at least 14 MiB).
make_compressible() {
    "$PY" - "$1" <<'PYEOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(2 << 20)
    f.write(b"snapfg-backup compresses this. " * ((8 << 20) // 31))
    f.seek(12 << 20)
    f.write(bytes(2 << 20))
PYEOF
}

# A chain's runs and their restores, after backup_server:
#
#   bk_run DIR N [ARGS]       save the origin as expect-DIR-N, then back it
#                             up into DIR (snapfg-backup backup ARGS);
#                             fails the test if the run fails
#   bk_restores DIR N [ARGS]  restore run N (restore ARGS) and compare it
#                             with expect-DIR-N
#   bk_expect_status N WHAT PATTERN STATUS
#                             STATUS is N and bk.log holds PATTERN
#   drop_our_checkpoints      drop every snapfg-backup- checkpoint of $ctl

bk_run() {
    local d=$1 n=$2
    shift 2
    save_origin "$origin" "$tmpdir/expect-$(basename "$d")-$n.img"
    bk -S "$ctl" -u "$origin" backup "$d" "$@" ||
        { cat "$tmpdir/bk.log" >&2; fail "backup $d run $n ($*) failed"; }
    info "$(basename "$d") run $n: $(tail -n 1 "$tmpdir/bk.log")"
}

bk_restores() {
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

bk_expect_status() {
    local want=$1 what=$2 pat=$3 st=$4
    if [ "$st" -eq "$want" ] && grep -q -- "$pat" "$tmpdir/bk.log"; then
        info "ok: $what"
    else
        check_fail "$what: exit $st (expected $want, '$pat'): $(cat "$tmpdir/bk.log")"
    fi
}

drop_our_checkpoints() {
    local c
    for c in $(our_checkpoints "$ctl"); do
        "$SNAPFGCTL" -S "$ctl" checkpoint drop "$c" >/dev/null 2>&1 || true
    done
}
