#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Crashes and gc in a repository:
#
# - a run killed with SIGKILL in the middle of its copy leaves the
#   repository valid: verify --all passes, its points restore, the next
#   run succeeds (and drops the crashed run's snapshot), gc removes the
#   crashed run's chunks (a writer of this host whose process is gone is
#   not waited for; one of another host until its registration is
#   stale);
# - gc racing a backup (with --grace 0, after a prune removed the
#   running backup's previous point) removes no chunk the running backup
#   references: the run succeeds and its point restores byte for byte.

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
require_backup_tools

repo_server a $((64 * 1024 * 1024))
repo=$(repo_loc crash)
rb init "$repo" || fail "init: $(cat "$tmpdir/rb.log")"
rb_run "$repo" d1 a 1

# --- kill -9 mid-run -------------------------------------------------------------
write_random_blocks "$origin_a" 200 11 "$size"
SNAPFG_BACKUP_TEST_STOP_AFTER=$((16 * 1024 * 1024)) \
    "$SNAPFG_BACKUP" -S "$ctl_a" -u "$origin_a" backup "$repo" --disk d1 --full \
    >"$tmpdir/killed.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = T ] && break
    sleep 0.1
done
[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = T ] ||
    fail "the run did not stop mid-copy: $(cat "$tmpdir/killed.log")"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
[ -n "$(repo_snapshots "$ctl_a")" ] || check_fail "the killed run left no snapshot (was it mid-run?)"
[ "$(repo_json "$repo" 'len(j["disks"][0]["runs"])')" -eq 1 ] ||
    check_fail "the killed run was recorded"
rb verify "$repo" --all || check_fail "verify after kill -9: $(cat "$tmpdir/rb.log")"
rb_restores "$repo" d1 1
# Other data, so that run 2 shares no chunk with the killed run.
write_random_blocks "$origin_a" 200 12 "$size"
rb_run "$repo" d1 a 2
grep -q 'left by an interrupted run' "$tmpdir/rb.log" ||
    check_fail "the next run did not drop the killed run's snapshot: $(cat "$tmpdir/rb.log")"
[ -z "$(repo_snapshots "$ctl_a")" ] || check_fail "snapshots left: $(repo_snapshots "$ctl_a")"
rb_restores "$repo" d1 2
[ "$(repo_checkpoints "$ctl_a" | wc -l)" -eq 1 ] ||
    check_fail "checkpoints left: $(repo_checkpoints "$ctl_a")"

# The killed run's chunks (or partial files) are referenced by no index:
# gc removes them (its registration is not waited for: its process is gone).
rb --json gc "$repo" --grace 0 || check_fail "gc: $(cat "$tmpdir/rb.log")"
"$PY" - "$tmpdir/rb.log" <<'PYEOF' || check_fail "gc after the killed run: $(cat "$tmpdir/rb.log")"
import json, sys
j = json.load(open(sys.argv[1]))
# The directory back end names a run's chunks only at its sync: the
# killed run left partial files; other back ends, chunk objects.
assert j["live_writers"] == 0 and j["missing_chunks"] == 0, j
assert j["removed_chunks"] + j.get("removed_partial", 0) > 0, j
PYEOF
# A registration of a writer that may still run elsewhere is waited for
# until it is stale.
if repo_is_dir; then
    mkdir -p "$repo/writers"
    echo '{"start": 1, "host": "elsewhere", "pid": 1, "disk": "x"}' >"$repo/writers/foreign"
    rb --json gc "$repo" --grace 0 || check_fail "gc: $(cat "$tmpdir/rb.log")"
    "$PY" -c 'import json,sys; j = json.load(open(sys.argv[1])); assert j["live_writers"] == 1 and j["cutoff"] <= 1, j' \
        "$tmpdir/rb.log" || check_fail "a foreign writer's registration: $(cat "$tmpdir/rb.log")"
    touch -d '-20 min' "$repo/writers/foreign"
    rb --json gc "$repo" --grace 0 || check_fail "gc: $(cat "$tmpdir/rb.log")"
    "$PY" -c 'import json,sys; j = json.load(open(sys.argv[1])); assert j["live_writers"] == 0, j' \
        "$tmpdir/rb.log" || check_fail "a stale registration still counts: $(cat "$tmpdir/rb.log")"
    rm "$repo/writers/foreign"
    # A crash between the link of a chunk under its name and the removal
    # of its temporary name leaves a .tmp that is a second link of the
    # chunk, and as young as the chunk (each run that keeps it touches
    # it): gc removes it anyway, and the chunk stays.
    c=$(repo_chunk_files "$repo" | head -n 1)
    ln "$c" "$(dirname "$c")/.tmp.0123456789abcdef"
    touch "$c"
    rb --json gc "$repo" --grace 0 || check_fail "gc: $(cat "$tmpdir/rb.log")"
    "$PY" -c 'import json,sys; j = json.load(open(sys.argv[1])); assert j["removed_partial"] == 1 and j["removed_chunks"] == 0, j' \
        "$tmpdir/rb.log" || check_fail "a linked .tmp: $(cat "$tmpdir/rb.log")"
    [ ! -e "$(dirname "$c")/.tmp.0123456789abcdef" ] && [ -f "$c" ] ||
        check_fail "gc did not remove the linked .tmp, or removed its chunk $c"
fi
rb verify "$repo" --all || check_fail "verify after gc: $(cat "$tmpdir/rb.log")"
rb_restores "$repo" d1 1
rb_restores "$repo" d1 2

# --- gc racing a backup -----------------------------------------------------------
# A run (paused after its copy) references every chunk of run 2.  Then
# four chunks change and run 3 stores them; prune keeps run 3 only, and
# gc --grace 0 runs while the paused run still waits: run 2's four old
# chunks are referenced by the paused run alone, which has no index yet.
# It becomes run 4 when it goes on.
save_origin "$origin_a" "$tmpdir/expect-d1-4.img"
SNAPFG_BACKUP_TEST_PAUSE=after-copy SNAPFG_BACKUP_TEST_RESUME="$tmpdir/resume" \
    timeout 600 "$SNAPFG_BACKUP" -S "$ctl_a" -u "$origin_a" --json backup "$repo" --disk d1 \
    >"$tmpdir/paused.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
    [ -n "$(repo_snapshots "$ctl_a")" ] && break
    sleep 0.05
done
sleep 1                         # past its copy (nothing to read)
"$PY" - "$origin_a" <<'PYEOF'
import nbd, os, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for mib in (0, 16, 32, 48):
    h.pwrite(os.urandom(4096), mib << 20)
h.shutdown()
PYEOF
rb_run "$repo" d1 a 3
rb prune "$repo" --disk d1 --keep-last 1 || check_fail "prune: $(cat "$tmpdir/rb.log")"
rb --json gc "$repo" --grace 0 || check_fail "gc during a backup: $(cat "$tmpdir/rb.log")"
info "gc during the backup: $(cat "$tmpdir/rb.log")"
touch "$tmpdir/resume"
st=0; wait "$pid" || st=$?
if [ "$st" -eq 0 ]; then
    n=$("$PY" -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]["run"])' "$tmpdir/paused.log")
    [ "$n" -eq 4 ] || check_fail "the paused run is run $n, expected 4"
    rb_restores "$repo" d1 4
    rb verify "$repo" --all || check_fail "verify after gc raced a backup: $(cat "$tmpdir/rb.log")"
else
    check_fail "the backup gc raced failed ($st): $(cat "$tmpdir/paused.log")"
fi
rb_restores "$repo" d1 3

finish
