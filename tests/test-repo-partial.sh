#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The directory back end's partial files (".tmp.*": a chunk written but
# not yet synced and named, docs/repository.md "Durability"):
#
# - a run stopped mid-copy has its new chunks only as partial files: no
#   chunk object under its name before the run's sync;
# - gc --grace 0 while that run is still alive keeps its partial files;
# - the run killed with SIGKILL: its partial files stay (nothing names
#   them), gc removes them (removed_partial), the repository verifies
#   and the next run is whole;
# - a run that fails (stopped, then continued: the copy ends with an
#   error) removes its own partial files.

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
require_backup_tools
repo_is_dir || skip "partial files are the directory back end's"

repo_server a $((48 * 1024 * 1024))
repo=$(repo_loc partial)
rb init "$repo" || fail "init: $(cat "$tmpdir/rb.log")"
rb_run "$repo" d a 1

partials() { find "$repo" -name '.tmp.*' | wc -l; }
chunks() { find "$repo/chunks" -type f ! -name '.tmp.*' | wc -l; }
[ "$(partials)" -eq 0 ] || check_fail "a finished run left partial files: $(find "$repo" -name '.tmp.*')"

# A run stopped after 16 MiB, in the background (a child of this shell,
# so that it can be waited for): its pid in $pid.
stopped_run() {   # LOG
    SNAPFG_BACKUP_TEST_STOP_AFTER=$((16 * 1024 * 1024)) \
        "$SNAPFG_BACKUP" -S "$ctl_a" -u "$origin_a" backup "$repo" --disk d --full \
        >"$1" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = T ] && break
        sleep 0.1
    done
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = T ] ||
        fail "the run did not stop mid-copy: $(cat "$1")"
}

# --- killed mid-run ---------------------------------------------------------
before=$(chunks)
write_random_blocks "$origin_a" 300 5 "$size"
stopped_run "$tmpdir/killed.log"
[ "$(partials)" -gt 0 ] || check_fail "the stopped run has no partial files"
[ "$(chunks)" -eq "$before" ] ||
    check_fail "chunks named before the run's sync: $before before, $(chunks) now"
# gc while the run lives keeps them.
n=$(partials)
rb --json gc "$repo" --grace 0 || check_fail "gc: $(cat "$tmpdir/rb.log")"
"$PY" -c 'import json,sys; j = json.load(open(sys.argv[1])); assert j["removed_partial"] == 0 and j["live_writers"] == 1, j' \
    "$tmpdir/rb.log" || check_fail "gc during a run: $(cat "$tmpdir/rb.log")"
[ "$(partials)" -eq "$n" ] || check_fail "gc removed partial files of a live run"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
[ "$(partials)" -eq "$n" ] || check_fail "partial files of the killed run: $n, then $(partials)"
# gc's cutoff is in whole seconds (--grace 0: "older than now"): a file
# written in the current second is not older yet.  Wait until the clock
# has passed the newest partial file's second.
newest=$(find "$repo" -name '.tmp.*' -printf '%T@\n' | sort -n | tail -n 1)
newest=${newest%.*}
while [ "$(date +%s)" -le "$newest" ]; do sleep 0.2; done
rb --json gc "$repo" --grace 0 || check_fail "gc: $(cat "$tmpdir/rb.log")"
"$PY" -c 'import json,sys; j = json.load(open(sys.argv[1])); assert j["removed_partial"] == int(sys.argv[2]), j' \
    "$tmpdir/rb.log" "$n" || check_fail "gc after the killed run: $(cat "$tmpdir/rb.log")"
[ "$(partials)" -eq 0 ] || check_fail "gc left partial files: $(find "$repo" -name '.tmp.*')"
rb verify "$repo" --all || check_fail "verify: $(cat "$tmpdir/rb.log")"
rb_restores "$repo" d 1

# --- a run that fails cleans up after itself ---------------------------------
stopped_run "$tmpdir/failed.log"
[ "$(partials)" -gt 0 ] || check_fail "the stopped run has no partial files"
kill -CONT "$pid"
st=0; wait "$pid" || st=$?
[ "$st" -ne 0 ] || check_fail "the stopped run exited 0"
[ "$(partials)" -eq 0 ] || check_fail "the failed run left partial files: $(find "$repo" -name '.tmp.*' | head -n 3)"

rb_run "$repo" d a 2
[ "$(partials)" -eq 0 ] || check_fail "run 2 left partial files"
rb verify "$repo" --all || check_fail "verify: $(cat "$tmpdir/rb.log")"
rb_restores "$repo" d 1
rb_restores "$repo" d 2

finish
