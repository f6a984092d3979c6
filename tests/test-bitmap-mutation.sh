#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Checkpoint bitmaps mutated while the server is stopped.  Each bitmap is
# bound to its catalogue, its checkpoint and the origin's identity, and a
# clean close writes a checksum of its bits.  Every case must end in
# "the checkpoint is inconsistent, the next incremental snapfg-backup run
# exits 3 and asks for --full, and a --full run then works" -- never in
# an incremental that copies the wrong ranges -- or, where nothing was
# wrong, in a correct incremental.
#
# Each case: a full backup (its checkpoint K), a checkpoint x after it,
# origin writes, a clean stop, the mutation, a restart, then:
#   - checkpoint list: the mutated checkpoint(s) "inconsistent";
#   - the log names the bitmap and says why;
#   - a foreign file (another checkpoint's or server's) is left as found;
#   - snapfg-backup backup DIR: exit 3, "--full" in its message;
#   - snapfg-backup backup DIR --full: exit 0, restored == origin.
# Cases:
#   none         (control) no mutation: the incremental works (exit 0)
#   swap         K's and x's bitmaps swapped
#   foreign      K's bitmap replaced by another server's (another origin
#                of the same size, its own catalogue), same name
#   truncated    K's bitmap cut short
#   flipped      a bit of K's bitmap flipped (its clean-close checksum
#                stays)
#   replaced     the origin replaced by rename (same path and size):
#                its bitmaps tracked another file; then origin-moved=true
#                keeps them (the incremental works)
set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools

MiB=$((1024 * 1024))
size=$((8 * MiB))
disk="$tmpdir/disk.img"
sock="$tmpdir/sock"
ctl="$tmpdir/ctl"
pidf="$tmpdir/nbdkit.pid"
origin=$(uri "$sock")

start() {
    rm -f "$ctl"
    start_snapfg "$sock" "$pidf" origin="$disk" state="$state" control="$ctl" "$@"
}
write_some() { write_random_blocks "$origin" "$1" "$2" "$size"; }

# bitmap_of NAME: the bitmap path of checkpoint NAME.
bitmap_of() {
    "$SNAPFGCTL" -S "$ctl" --json checkpoint list |
        "$PY" -c 'import json, sys
for c in json.load(sys.stdin)["checkpoints"]:
    if c["name"] == sys.argv[1]:
        print(c["bitmap"])' "$1"
}
# state_of NAME: its state in checkpoint list.
state_of() {
    "$SNAPFGCTL" -S "$ctl" --json checkpoint list |
        "$PY" -c 'import json, sys
for c in json.load(sys.stdin)["checkpoints"]:
    if c["name"] == sys.argv[1]:
        print(c["state"])' "$1"
}

# setup CASE: a new origin, catalogue and backup directory; a full backup
# (checkpoint $K, bitmap $KB), a checkpoint x (bitmap $XB), writes; the
# server stopped cleanly.
setup() {
    local c=$1 st=0
    state="$tmpdir/$c.state"
    dir="$tmpdir/$c.backups"
    make_random_image "$disk" "$size"
    start
    bk -S "$ctl" -u "$origin" backup "$dir" || st=$?
    [ "$st" = 0 ] || { cat "$tmpdir/bk.log" >&2; fail "$c: the full backup exited $st"; }
    K=$(our_checkpoints "$ctl")
    [ -n "$K" ] && [ "$(wc -w <<<"$K")" = 1 ] || fail "$c: the backup's checkpoint: '$K'"
    ctl_ok "$c: checkpoint create x" "$ctl" checkpoint create x
    KB=$(bitmap_of "$K")
    XB=$(bitmap_of x)
    write_some 20 "$RANDOM"
    stop_nbdkit "$pidf"
}

# need_full CASE: the incremental exits 3 asking for --full; --full works
# and restores the origin.
need_full() {
    local c=$1 st=0
    bk -S "$ctl" -u "$origin" backup "$dir" || st=$?
    if [ "$st" = 3 ] && grep -q -- "--full" "$tmpdir/bk.log"; then
        info "ok: $c: the incremental exits 3: $(grep -m1 -- "--full" "$tmpdir/bk.log")"
    else
        cat "$tmpdir/bk.log" >&2
        check_fail "$c: the incremental exited $st (expected 3, asking for --full)"
        return
    fi
    save_origin "$origin" "$tmpdir/expect.img"
    st=0
    bk -S "$ctl" -u "$origin" backup "$dir" --full || st=$?
    [ "$st" = 0 ] || { cat "$tmpdir/bk.log" >&2; check_fail "$c: backup --full exited $st"; return; }
    restore_latest "$c"
}

# restore_latest CASE: the newest run restores what the origin was.
restore_latest() {
    local n
    n=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["runs"][-1]["seq"])' "$dir/manifest.json")
    restore_equals "$dir" "$n" "$tmpdir/expect.img" "$1: run $n restored"
}

# inconsistent CASE NAME MSG: NAME is listed inconsistent and the log says MSG.
inconsistent() {
    local c=$1 st
    st=$(state_of "$2")
    [ "$st" = inconsistent ] && info "ok: $c: checkpoint $2 is inconsistent" ||
        check_fail "$c: checkpoint $2 is '$st', expected inconsistent"
    grep -qF -- "$3" "$pidf.log" && info "ok: $c: the log says: $(grep -m1 -F -- "$3" "$pidf.log")" ||
        check_fail "$c: the log does not say '$3'"
}

# ---- none (the control) -------------------------------------------------
info "=== none: no mutation, the incremental works"
setup none
start
[ "$(state_of "$K")" = frozen ] || check_fail "none: $K is '$(state_of "$K")', expected frozen"
save_origin "$origin" "$tmpdir/expect.img"
st=0; bk -S "$ctl" -u "$origin" backup "$dir" || st=$?
[ "$st" = 0 ] && info "ok: none: the incremental works" ||
    { cat "$tmpdir/bk.log" >&2; check_fail "none: the incremental exited $st"; }
restore_latest none
stop_nbdkit "$pidf"

# ---- swap ------------------------------------------------------------------
info "=== swap: the bitmaps of $K and x swapped"
setup swap
mv "$KB" "$tmpdir/k.cbt"; mv "$XB" "$KB"; mv "$tmpdir/k.cbt" "$XB"
sk=$(checksum "$KB"); sx=$(checksum "$XB")
start
inconsistent swap "$K" "belongs to checkpoint \"x\""
inconsistent swap x "belongs to checkpoint \"$K\""
[ "$(checksum "$KB")" = "$sk" ] && [ "$(checksum "$XB")" = "$sx" ] &&
    info "ok: swap: both foreign files are left as they were" ||
    check_fail "swap: the server wrote into a foreign bitmap"
need_full swap
stop_nbdkit "$pidf"

# ---- foreign: another server's bitmap ---------------------------------------
info "=== foreign: $K's bitmap replaced by another server's"
# The other server: another origin of the same size, its own catalogue;
# its checkpoint has the same name (the first run of a chain).
setup other
other_kb=$KB
setup foreign
[ "$(basename "$other_kb")" = "$(basename "$KB")" ] ||
    info "(the other server's checkpoint is $(basename "$other_kb"))"
cp "$other_kb" "$KB"
sk=$(checksum "$KB")
start
inconsistent foreign "$K" "belongs to another catalogue"
[ "$(checksum "$KB")" = "$sk" ] && info "ok: foreign: the other server's file is left as it was" ||
    check_fail "foreign: the server wrote into the other server's bitmap"
need_full foreign
stop_nbdkit "$pidf"

# ---- truncated ------------------------------------------------------------------
info "=== truncated: $K's bitmap cut short"
setup truncated
truncate -s 4100 "$KB"
start
inconsistent truncated "$K" "truncated"
need_full truncated
stop_nbdkit "$pidf"

# ---- flipped ----------------------------------------------------------------------
info "=== flipped: a bit of $K's bitmap flipped under its checksum"
setup flipped
"$PY" - "$KB" <<'EOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(4096 + 8)          # a bit of granules 64..71
    b = f.read(1)[0]
    f.seek(4096 + 8)
    f.write(bytes([b ^ 0x01]))
EOF
start
inconsistent flipped "$K" "do not match the checksum"
need_full flipped
stop_nbdkit "$pidf"

# ---- replaced origin -----------------------------------------------------------------
info "=== replaced: the origin replaced by rename"
setup replaced
cp "$disk" "$tmpdir/new.img"
mv "$tmpdir/new.img" "$disk"
start
inconsistent replaced "$K" "tracked another origin"
need_full replaced
stop_nbdkit "$pidf"
info "--- replaced, then origin-moved=true keeps the bitmaps"
setup moved
cp "$disk" "$tmpdir/new.img"
mv "$tmpdir/new.img" "$disk"
start origin-moved=true
[ "$(state_of "$K")" = frozen ] && info "ok: moved: $K stays frozen with origin-moved=true" ||
    check_fail "moved: $K is '$(state_of "$K")' with origin-moved=true"
grep -q "origin-moved=true: it tracked" "$pidf.log" ||
    check_fail "moved: no notice that the bitmaps were rebound"
save_origin "$origin" "$tmpdir/expect.img"
st=0; bk -S "$ctl" -u "$origin" backup "$dir" || st=$?
[ "$st" = 0 ] && info "ok: moved: the incremental works" ||
    { cat "$tmpdir/bk.log" >&2; check_fail "moved: the incremental exited $st"; }
restore_latest moved
stop_nbdkit "$pidf"
start                       # rebound: no origin-moved needed any more
"$SNAPFGCTL" -S "$ctl" --json checkpoint list | grep -q '"inconsistent"' &&
    check_fail "moved, restarted without origin-moved: a checkpoint is inconsistent" ||
    info "ok: moved: rebound, the next start needs no origin-moved"
stop_nbdkit "$pidf"

finish
