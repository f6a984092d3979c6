#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup against a tampered backup directory (rows 1, 6 and 11 of
# the hardening list):
#
# 1. A directory that others can write is refused (which, and how to fix
#    it); links planted where a run creates its files (the image's
#    .partial, manifest.json.tmp) are never written through: the run
#    fails, the links' targets are unchanged, and once they are removed
#    the next run works.
# 6. A run whose sums file is missing, or whose manifest record has no
#    "sums", is not restored (exit 1, naming the run and the file) unless
#    --no-verify is given.
# 11. Images of the chain swapped, resized, or a manifest whose chain
#    loops: restore and verify refuse before reading, naming the file.
#    The tool killed (-9) during a restore leaves no qemu-nbd behind.

set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
require_backup_tools

backup_server $((32 * 1024 * 1024))


# --- row 1: a directory others can write --------------------------------
mkdir -m 0777 "$tmpdir/open"
chmod 0777 "$tmpdir/open"
st=0; bk -S "$ctl" -u "$origin" backup "$tmpdir/open" || st=$?
bk_expect_status 1 "a world-writable directory is refused" 'chmod go-w' "$st"
grep -q 'writable by its group and by others' "$tmpdir/bk.log" || check_fail "the refusal does not say who can write"
[ -z "$(ls -A "$tmpdir/open")" ] || check_fail "the refused run wrote $(ls -A "$tmpdir/open")"
[ -z "$(our_snapshots "$ctl")" ] || check_fail "the refused run left a snapshot"
mkdir -m 0775 "$tmpdir/group"
chmod 0775 "$tmpdir/group"
st=0; bk -S "$ctl" -u "$origin" backup "$tmpdir/group" || st=$?
bk_expect_status 1 "a group-writable directory is refused" 'writable by its group' "$st"

# --- row 1: links planted during a run ------------------------------------
echo "root's file" >"$tmpdir/victim"
cp "$tmpdir/victim" "$tmpdir/victim.orig"
# plant_during POINT NAME: start a run that pauses at POINT, plant NAME
# as a link to the victim, let it go on; its exit status in $st.
plant_during() {
    local point=$1 name=$2 pid
    rm -f "$tmpdir/resume"
    SNAPFG_BACKUP_TEST_PAUSE=$point SNAPFG_BACKUP_TEST_RESUME="$tmpdir/resume" \
        timeout 120 "$SNAPFG_BACKUP" -S "$ctl" -u "$origin" backup "$dir" \
        >"$tmpdir/bk.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        [ -n "$(our_snapshots "$ctl")" ] && break
        sleep 0.05
    done
    [ -n "$(our_snapshots "$ctl")" ] || fail "the run made no snapshot: $(cat "$tmpdir/bk.log")"
    # The pause points come right after the snapshot and after the copy.
    [ "$point" = before-image ] || for _ in $(seq 600); do
        [ -e "$dir/$(printf %04d "$3")-$4.qcow2.partial" ] && break
        sleep 0.05
    done
    sleep 0.5
    ln -s "$tmpdir/victim" "$dir/$name"
    touch "$tmpdir/resume"
    st=0; wait "$pid" || st=$?
}
plant_during before-image 0001-full.qcow2.partial
bk_expect_status 1 "a .partial link planted before the image is created" 'exists' "$st"
cmp -s "$tmpdir/victim" "$tmpdir/victim.orig" || check_fail "the image was written through the planted .partial link"
[ -L "$dir/0001-full.qcow2.partial" ] || check_fail "the planted link is gone (it is not the run's to remove)"
[ -z "$(our_snapshots "$ctl")" ] || check_fail "the failed run left a snapshot"
rm -f "$dir/0001-full.qcow2.partial"

# A manifest.json.tmp planted while the run holds the directory's lock
# is replaced (the lock makes it the run's leftover), not written
# through.
save_origin "$origin" "$tmpdir/expect-1.img"
plant_during after-copy manifest.json.tmp 1 full
bk_expect_status 0 "a manifest.json.tmp link planted during the copy" 'run 1: full backup' "$st"
cmp -s "$tmpdir/victim" "$tmpdir/victim.orig" || check_fail "the manifest was written through the planted link"
[ -f "$dir/manifest.json" ] && [ ! -L "$dir/manifest.json" ] && [ ! -e "$dir/manifest.json.tmp" ] ||
    check_fail "manifest.json is not a file of its own: $(ls -l "$dir")"
write_random_blocks "$origin" 40 1 "$size"

# The images are private; more runs work.
for n in 2 3; do
    save_origin "$origin" "$tmpdir/expect-$n.img"
    bk -S "$ctl" -u "$origin" backup "$dir" || { cat "$tmpdir/bk.log" >&2; fail "run $n failed"; }
    write_random_blocks "$origin" 40 "$n" "$size"
done
[ "$(stat -c %a "$dir/0001-full.qcow2")" = 600 ] || check_fail "the full image is mode $(stat -c %a "$dir/0001-full.qcow2"), not 0600"
for n in 1 2 3; do
    restore_equals "$dir" $n "$tmpdir/expect-$n.img" "restore of run $n after the planted links"
done

# --- row 6: a run that cannot be verified ---------------------------------
cp -a "$dir" "$tmpdir/nosums"
rm "$tmpdir/nosums/0002.sums"
st=0; bk restore "$tmpdir/nosums" "$tmpdir/r.img" --at 2 || st=$?
bk_expect_status 1 "restore without the sums file" 'run 2 cannot be verified: .*0002.sums' "$st"
[ ! -e "$tmpdir/r.img" ] || check_fail "restore without sums wrote its output"
bk restore "$tmpdir/nosums" "$tmpdir/r.img" --at 2 --no-verify ||
    { cat "$tmpdir/bk.log" >&2; check_fail "restore --no-verify failed"; }
grep -q 'NOT verified' "$tmpdir/bk.log" || check_fail "restore --no-verify does not say it did not verify"
cmp "$tmpdir/r.img" "$tmpdir/expect-2.img" || check_fail "restore --no-verify of run 2 differs"
rm -f "$tmpdir/r.img"
"$PY" - "$tmpdir/nosums/manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
del m["runs"][0]["sums"]
json.dump(m, open(sys.argv[1], "w"))
PYEOF
st=0; bk restore "$tmpdir/nosums" "$tmpdir/r.img" --at 1 || st=$?
bk_expect_status 1 "restore of a record without sums" 'run 1 in .* records no block sums file' "$st"
grep -q '(null)' "$tmpdir/bk.log" && check_fail "a message says (null)"
st=0; bk verify "$tmpdir/nosums" --at 2 || st=$?
bk_expect_status 1 "verify without the sums file" '0002.sums' "$st"

# --- row 11: the chain against the manifest -------------------------------
cp -a "$dir" "$tmpdir/swapped"
mv "$tmpdir/swapped/0002-incr.qcow2" "$tmpdir/swapped/x"
mv "$tmpdir/swapped/0003-incr.qcow2" "$tmpdir/swapped/0002-incr.qcow2"
mv "$tmpdir/swapped/x" "$tmpdir/swapped/0003-incr.qcow2"
for n in 2 3; do
    st=0; bk restore "$tmpdir/swapped" "$tmpdir/r.img" --at $n || st=$?
    bk_expect_status 1 "restore --at $n with 0002 and 0003 swapped" 'do not match the manifest' "$st"
    [ ! -e "$tmpdir/r.img" ] || check_fail "restore of a swapped chain wrote its output"
done
st=0; bk verify "$tmpdir/swapped" --all || st=$?
bk_expect_status 1 "verify --all with 0002 and 0003 swapped" 'do not match the manifest' "$st"
cp -a "$dir" "$tmpdir/resized"
qemu-img resize -q "$tmpdir/resized/0002-incr.qcow2" +1M
st=0; bk restore "$tmpdir/resized" "$tmpdir/r.img" --at 3 || st=$?
bk_expect_status 1 "restore with a resized image in the chain" "0002-incr.qcow2 .*size is not the run's" "$st"
cp -a "$dir" "$tmpdir/loop"
"$PY" - "$tmpdir/loop/manifest.json" <<'PYEOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["runs"][0]["backing"] = "0003-incr.qcow2"
json.dump(m, open(sys.argv[1], "w"))
PYEOF
st=0; bk restore "$tmpdir/loop" "$tmpdir/r.img" --at 3 || st=$?
bk_expect_status 1 "restore of a manifest whose chain loops" 'the images do not match\|loops' "$st"
cp -a "$dir" "$tmpdir/linked"
mv "$tmpdir/linked/0001-full.qcow2" "$tmpdir/full-elsewhere.qcow2"
ln -s "$tmpdir/full-elsewhere.qcow2" "$tmpdir/linked/0001-full.qcow2"
st=0; bk restore "$tmpdir/linked" "$tmpdir/r.img" --at 2 || st=$?
bk_expect_status 1 "restore through a linked image" 'symbolic link' "$st"

# The tool killed during a restore: its qemu-nbd go with it.
rm -f "$tmpdir/resume"
SNAPFG_BACKUP_TEST_PAUSE=restore-copy SNAPFG_BACKUP_TEST_RESUME="$tmpdir/resume" \
    "$SNAPFG_BACKUP" restore "$dir" "$tmpdir/killed.img" >"$tmpdir/bk.log" 2>&1 &
pid=$!
# It pauses with both qemu-nbd (the chain, the output) running.
for _ in $(seq 300); do
    [ "$(pgrep -P "$pid" -x qemu-nbd | wc -l)" -ge 2 ] && break
    sleep 0.1
done
children=$(pgrep -P "$pid" -x qemu-nbd | tr '\n' ' ')
[ "$(echo $children | wc -w)" -ge 2 ] || check_fail "not two qemu-nbd under the restore: '$children'"
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
alive() { for c in $children; do kill -0 "$c" 2>/dev/null && echo "$c"; done; true; }
for _ in $(seq 100); do
    [ -z "$(alive)" ] && break
    sleep 0.1
done
if [ -n "$(alive)" ]; then
    check_fail "qemu-nbd outlived the killed restore: $(alive)"
    for c in $(alive); do kill -KILL "$c" 2>/dev/null || true; done
else
    info "ok: no qemu-nbd outlives a killed restore"
fi

for c in $(our_checkpoints "$ctl"); do "$SNAPFGCTL" -S "$ctl" checkpoint drop "$c" >/dev/null 2>&1 || true; done
stop_nbdkit "$pidf"
finish
