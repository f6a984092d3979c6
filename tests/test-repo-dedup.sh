#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A repository shared by two disks: a second disk made from the same
# image stores (almost) nothing new; runs of the two disks at the same
# time, and two runs of one disk at the same time, all succeed with
# their own points and numbers, each restored byte for byte.

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
require_backup_tools

copy_of_a() { cp "$disk_a" "$1"; }
repo_server a $((64 * 1024 * 1024))
repo_server b $((64 * 1024 * 1024)) copy_of_a
repo=$(repo_loc shared)
rb init "$repo" || fail "init: $(cat "$tmpdir/rb.log")"

# --- dedup across disks ---------------------------------------------------------
rb_run "$repo" vm1 a 1
rb_run "$repo" vm2 b 1
first=$(run_field vm1 1 bytes_added)
second=$(run_field vm2 1 bytes_added)
if [ "$first" -gt 0 ] && [ "$second" -le $((first / 10)) ]; then
    info "ok: the second disk stored $second bytes, the first $first"
else
    check_fail "dedup: the second disk stored $second bytes, the first $first (want <= 10 %)"
fi
[ "$(run_field vm2 1 chunks_reused)" -eq 16 ] ||
    check_fail "the second disk reused $(run_field vm2 1 chunks_reused) chunks of 16"

# --- two disks at once ----------------------------------------------------------
write_random_blocks "$origin_a" 50 1 "$size"
write_random_blocks "$origin_b" 50 2 "$size"
save_origin "$origin_a" "$tmpdir/expect-vm1-2.img"
save_origin "$origin_b" "$tmpdir/expect-vm2-2.img"
# The first waits after its copy until the second is done: they overlap.
SNAPFG_BACKUP_TEST_PAUSE=after-copy SNAPFG_BACKUP_TEST_RESUME="$tmpdir/resume1" \
    timeout 600 "$SNAPFG_BACKUP" -S "$ctl_a" -u "$origin_a" backup "$repo" --disk vm1 \
    >"$tmpdir/c1.log" 2>&1 &
p1=$!
timeout 600 "$SNAPFG_BACKUP" -S "$ctl_b" -u "$origin_b" backup "$repo" --disk vm2 \
    >"$tmpdir/c2.log" 2>&1 &
p2=$!
st2=0; wait "$p2" || st2=$?
kill -0 "$p1" 2>/dev/null || check_fail "the first run did not wait for the second"
touch "$tmpdir/resume1"
st1=0; wait "$p1" || st1=$?
[ "$st1" -eq 0 ] && [ "$st2" -eq 0 ] ||
    check_fail "concurrent runs: exit $st1 and $st2: $(cat "$tmpdir/c1.log" "$tmpdir/c2.log")"
rb_restores "$repo" vm1 2
rb_restores "$repo" vm2 2
rb_restores "$repo" vm1 1
rb_restores "$repo" vm2 1

# --- two runs of one disk at once: numbers 3 and 4 ------------------------------
write_random_blocks "$origin_a" 20 3 "$size"
save_origin "$origin_a" "$tmpdir/expect-vm1-3.img"
cp "$tmpdir/expect-vm1-3.img" "$tmpdir/expect-vm1-4.img"
SNAPFG_BACKUP_TEST_PAUSE=after-copy SNAPFG_BACKUP_TEST_RESUME="$tmpdir/resume2" \
    timeout 600 "$SNAPFG_BACKUP" -S "$ctl_a" -u "$origin_a" --json backup "$repo" --disk vm1 \
    >"$tmpdir/s1.log" 2>&1 &
p1=$!
# Its snapshot exists before the second starts.
for _ in $(seq 600); do
    [ -n "$(repo_snapshots "$ctl_a")" ] && break
    sleep 0.05
done
st2=0; rb -S "$ctl_a" -u "$origin_a" --json backup "$repo" --disk vm1 || st2=$?
cp "$tmpdir/rb.log" "$tmpdir/s2.log"
touch "$tmpdir/resume2"
st1=0; wait "$p1" || st1=$?
[ "$st1" -eq 0 ] && [ "$st2" -eq 0 ] ||
    check_fail "two runs of one disk: exit $st1 and $st2: $(cat "$tmpdir/s1.log" "$tmpdir/s2.log")"
nums=$(cat "$tmpdir/s1.log" "$tmpdir/s2.log" | grep '^{' | "$PY" -c 'import json, sys
print(" ".join(sorted(str(json.loads(l)["run"]) for l in sys.stdin)))')
[ "$nums" = "3 4" ] || check_fail "two runs of one disk got numbers '$nums', expected '3 4'"
rb_restores "$repo" vm1 3
rb_restores "$repo" vm1 4
[ -z "$(repo_snapshots "$ctl_a")" ] || check_fail "snapshots left: $(repo_snapshots "$ctl_a")"
[ "$(repo_checkpoints "$ctl_a" | wc -l)" -eq 1 ] ||
    check_fail "checkpoints left on server a: $(repo_checkpoints "$ctl_a")"
rb verify "$repo" --all || check_fail "verify --all: $(cat "$tmpdir/rb.log")"
# A next run of vm1 is an incremental again.
rb_run "$repo" vm1 a 5
[ "$(run_field vm1 5 type)" = incremental ] && [ "$(run_field vm1 5 bytes_read)" -eq 0 ] ||
    check_fail "run 5 after two concurrent runs: $(cat "$tmpdir/run-vm1-5.json")"

finish
