#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup: a chain of one full and three incremental backups while
# a writer keeps writing the origin between and during the runs.
#
# - Each restored point equals the origin at its snapshot's instant, byte
#   for byte (the writer is quiesced just before each run so the origin
#   can be saved, and resumes as soon as the run's snapshot exists, so it
#   writes during the copy).
# - Each incremental copies exactly the granules written since the
#   previous run's snapshot (bytes copied + zeroed against the writer's
#   log).
# - The snapshot is gone after each run; one checkpoint of the chain is
#   left on the server; the images form a qcow2 backing chain with
#   relative names (qemu-img info --backing-chain, qemu-img convert of the
#   chain after moving DIR); restore -O qcow2; restore refuses an
#   existing OUT; usage errors, --version, --help.

set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools

# Some zeroes, so that the full backup has blocks to skip.
zero_16m_at_8m() {
    dd if=/dev/zero of="$1" bs=1M seek=8 count=16 conv=notrunc status=none
}
backup_server $((64 * 1024 * 1024)) zero_16m_at_8m

# --- usage ---------------------------------------------------------------
st=0; "$SNAPFG_BACKUP" --version >"$tmpdir/v" 2>&1 || st=$?
[ "$st" -eq 0 ] && grep -qx 'snapfg-backup [0-9][0-9.]*' "$tmpdir/v" ||
    check_fail "--version: status $st, printed $(cat "$tmpdir/v")"
st=0; "$SNAPFG_BACKUP" --help >"$tmpdir/h" 2>&1 || st=$?
[ "$st" -eq 0 ] && grep -q 'restore DIR OUT' "$tmpdir/h" ||
    check_fail "--help: status $st"
for args in "backup $dir" "-S $ctl backup $dir" "-S $ctl -u $origin backup" \
            "restore $dir" "frobnicate" "-S $ctl -u $origin restore $dir x --full" \
            "restore $dir x -O vmdk" "restore $dir x --at 0"; do
    st=0
    # shellcheck disable=SC2086
    bk $args || st=$?
    [ "$st" -eq 2 ] || check_fail "snapfg-backup $args: exit $st, expected 2 (usage)"
done
[ ! -e "$dir" ] || check_fail "a usage error created $dir"

# A directory that is not empty and holds no manifest is not ours.
mkdir "$tmpdir/other"
echo keep >"$tmpdir/other/notes.txt"
st=0; bk -S "$ctl" -u "$origin" backup "$tmpdir/other" || st=$?
[ "$st" -eq 1 ] && grep -q 'not empty' "$tmpdir/bk.log" ||
    check_fail "backup into a foreign directory: exit $st: $(cat "$tmpdir/bk.log")"
[ "$(cat "$tmpdir/other/notes.txt")" = keep ] && [ "$(ls "$tmpdir/other")" = notes.txt ] ||
    check_fail "backup into a foreign directory touched it"
[ -z "$(our_snapshots "$ctl")" ] || check_fail "a refused run left a snapshot"

# --- the chain -------------------------------------------------------------
writer_start "$origin" "$size"
sleep 1
for n in 1 2 3 4; do
    st=0
    backup_during_writes "$tmpdir/expect-$n.img" "$ctl" "$origin" "$dir" || st=$?
    if [ "$st" -ne 0 ]; then
        cat "$tmpdir/bk.log" >&2
        fail "backup run $n exited $st"
    fi
    info "run $n: $(tail -n 1 "$tmpdir/bk.log")"
    sleep 1                     # the writer writes on between runs
done
writer_stop

[ -z "$(our_snapshots "$ctl")" ] || check_fail "snapshots left: $(our_snapshots "$ctl")"
ck=$(our_checkpoints "$ctl" | sort)
[ "$(echo "$ck" | wc -l)" -eq 2 ] && [ "$ck" = "$(chain_checkpoints "$dir")" ] &&
    echo "$ck" | grep -qx "$(manifest_field "$dir" 4 checkpoint)" &&
    echo "$ck" | grep -qx "$(manifest_field "$dir" 1 checkpoint)" ||
    check_fail "checkpoints left on the server: '$ck' (expected run 4's and the full run 1's)"
[ "$(manifest_field "$dir" 1 type)" = full ] || check_fail "run 1 is not full"
for n in 2 3 4; do
    [ "$(manifest_field "$dir" $n type)" = incremental ] || check_fail "run $n is not incremental"
    [ -f "$dir/$(printf %04d $n)-incr.qcow2" ] || check_fail "no $(printf %04d $n)-incr.qcow2"
done
[ "$(manifest_field "$dir" 1 image)" = 0001-full.qcow2 ] || check_fail "run 1's image name"
ls "$dir" | grep -q partial && check_fail "partial images left: $(ls "$dir")"

# The full backup skipped the zero blocks.
copied=$(manifest_field "$dir" 1 bytes_copied)
[ "$copied" -lt "$size" ] && [ "$copied" -ge $((size - 16 * 1024 * 1024)) ] ||
    check_fail "full run copied $copied bytes of $size (16 MiB were zero)"

# Incrementals copy exactly the granules written since the previous
# run's snapshot: run N holds phase N-1's writes.
for n in 2 3 4; do
    g=$(writer_granules $((n - 1)))
    c=$(manifest_field "$dir" $n bytes_copied)
    z=$(manifest_field "$dir" $n bytes_zeroed)
    if [ $((c + z)) -eq $((g * 65536)) ] && [ "$g" -gt 0 ]; then
        info "ok: run $n copied $c + zeroed $z bytes = $g granules written"
    else
        check_fail "run $n copied $c + zeroed $z bytes; the writer changed $g granules ($((g * 65536)) bytes)"
    fi
done

# A progress line on a terminal only (--progress=auto); the last line
# has the duration and rate.
grep -q ' of [0-9]* MiB (' "$tmpdir/bk.log" && check_fail "a progress line although stderr is not a terminal"
tail -n 1 "$tmpdir/bk.log" | grep -q ' in [0-9.]* s ([0-9.]* MiB/s)' ||
    check_fail "the last line has no duration and rate: $(tail -n 1 "$tmpdir/bk.log")"
if have script; then
    script -qec "$SNAPFG_BACKUP restore $dir $tmpdir/tty.img" /dev/null >"$tmpdir/tty.log" 2>&1 || true
    grep -q 'verify: .* MiB (100%), .* MiB/s' "$tmpdir/tty.log" ||
        check_fail "no progress line on a terminal: $(tr '\r' '\n' <"$tmpdir/tty.log" | tail -n 3)"
    cmp "$tmpdir/tty.img" "$tmpdir/expect-4.img" || check_fail "restore on a terminal differs"
else
    skip_part "the progress line on a terminal: script(1) (util-linux) is not installed"
fi

# Every point, byte for byte.
for n in 1 2 3 4; do
    restore_equals "$dir" $n "$tmpdir/expect-$n.img" "restore of run $n"
done
# The latest by default, and as qcow2.
bk restore "$dir" "$tmpdir/latest.img" || { cat "$tmpdir/bk.log" >&2; check_fail "restore (latest)"; }
cmp "$tmpdir/latest.img" "$tmpdir/expect-4.img" || check_fail "restore without --at is not run 4"
bk restore "$dir" "$tmpdir/r2.qcow2" --at 2 -O qcow2 || { cat "$tmpdir/bk.log" >&2; check_fail "restore -O qcow2"; }
[ "$(qemu-img info --output=json "$tmpdir/r2.qcow2" | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["format"], d.get("backing-filename"))')" = "qcow2 None" ] ||
    check_fail "restore -O qcow2 did not write a standalone qcow2 image"
qemu-img convert -O raw "$tmpdir/r2.qcow2" "$tmpdir/r2.raw"
cmp "$tmpdir/r2.raw" "$tmpdir/expect-2.img" || check_fail "restore -O qcow2 of run 2 differs"
# OUT is never overwritten.
echo mine >"$tmpdir/exists"
st=0; bk restore "$dir" "$tmpdir/exists" || st=$?
[ "$st" -eq 1 ] && [ "$(cat "$tmpdir/exists")" = mine ] ||
    check_fail "restore over an existing file: exit $st, file $(head -c 20 "$tmpdir/exists")"
# An empty file (mktemp's) holds nothing to lose.
: >"$tmpdir/empty.img"
bk restore "$dir" "$tmpdir/empty.img" --at 1 || { cat "$tmpdir/bk.log" >&2; check_fail "restore into an empty file"; }
cmp "$tmpdir/empty.img" "$tmpdir/expect-1.img" || check_fail "restore into an empty file differs"
st=0; bk restore "$dir" "$tmpdir/nope" --at 9 || st=$?
[ "$st" -eq 1 ] && grep -q 'no run 9' "$tmpdir/bk.log" || check_fail "restore --at 9: exit $st"

# A damaged image is caught by the checksums.
cp -a "$dir" "$tmpdir/damaged"
"$PY" - "$tmpdir/damaged" <<'EOF'
import nbd, subprocess, sys
# Change one byte of run 3's own data through qemu-nbd (a valid image
# with wrong contents).
h = nbd.NBD()
h.connect_systemd_socket_activation(["qemu-nbd", "-f", "qcow2", sys.argv[1] + "/0003-incr.qcow2"])
import json
m = json.load(open(sys.argv[1] + "/manifest.json"))
h.pwrite(b"\xa5" * 512, 12345 * 512)
h.flush()
h.shutdown()
EOF
st=0; bk restore "$tmpdir/damaged" "$tmpdir/bad.img" --at 3 || st=$?
[ "$st" -eq 1 ] && grep -q 'differs from run 3' "$tmpdir/bk.log" && [ ! -e "$tmpdir/bad.img" ] ||
    check_fail "restore of a damaged image: exit $st: $(cat "$tmpdir/bk.log")"

# An image the manifest does not know is not removed or replaced.
echo foreign >"$tmpdir/damaged/0005-incr.qcow2"
st=0; bk -S "$ctl" -u "$origin" backup "$tmpdir/damaged" || st=$?
[ "$st" -eq 1 ] && grep -q 'not in the manifest' "$tmpdir/bk.log" &&
    [ "$(cat "$tmpdir/damaged/0005-incr.qcow2")" = foreign ] ||
    check_fail "backup beside an unknown image: exit $st: $(cat "$tmpdir/bk.log")"
[ -z "$(our_snapshots "$ctl")" ] || check_fail "the refused run left a snapshot"

# qemu-img alone reads the chain, after the directory moved.
mv "$dir" "$tmpdir/moved"
qemu-img info --backing-chain "$tmpdir/moved/0004-incr.qcow2" >"$tmpdir/chain" ||
    check_fail "qemu-img info --backing-chain failed"
for f in 0001-full 0002-incr 0003-incr 0004-incr; do
    grep -q "^image: .*$f.qcow2" "$tmpdir/chain" || check_fail "the backing chain lacks $f"
done
qemu-img convert -O raw "$tmpdir/moved/0003-incr.qcow2" "$tmpdir/qi3.img"
cmp "$tmpdir/qi3.img" "$tmpdir/expect-3.img" || check_fail "qemu-img convert of run 3 after mv differs"

"$SNAPFGCTL" -S "$ctl" checkpoint drop "$ck" >/dev/null 2>&1 || true
stop_nbdkit "$pidf"
finish
