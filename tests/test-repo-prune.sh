#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# prune on a repository, with Proxmox Backup's rules: runs stamped with
# chosen times (SNAPFG_BACKUP_TEST_TIME, for tests only), prune --dry-run
# --json names the runs each rule keeps, prune removes only the others
# (their points are gone, the kept ones restore), gc then removes the
# chunks no point references.

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
require_backup_tools
export TZ=UTC

repo_server a $((8 * 1024 * 1024))
repo=$(repo_loc prune)
rb init "$repo" || fail "init: $(cat "$tmpdir/rb.log")"

# Seven runs (each with a change, so that each has chunks of its own).
times=("2026-01-01 10:00" "2026-01-01 10:30" "2026-01-01 11:00"
       "2026-01-02 09:00" "2026-01-08 09:00" "2026-02-01 09:00"
       "2026-02-01 09:10")
n=0
for t in "${times[@]}"; do
    n=$((n + 1))
    write_random_blocks "$origin_a" 4 "$n" "$size"
    SNAPFG_BACKUP_TEST_TIME=$(date -d "$t" +%s) rb_run "$repo" d1 a $n
done

# PBS: keep-last 1 keeps run 7; keep-daily 2 then the newest of the
# next two days without a kept run (run 6 is in run 7's day): runs 5
# and 4; keep-monthly 2 finds both months covered.  Runs 1, 2, 3, 6 go.
check_prune() {
    local want=$1
    shift
    rb --json prune "$repo" --disk d1 --dry-run "$@" || { check_fail "prune $*: $(cat "$tmpdir/rb.log")"; return; }
    got=$("$PY" -c 'import json, sys
j = json.load(open(sys.argv[1]))
print(" ".join(str(r["run"]) for r in j["disks"][0]["runs"] if r["keep"]))' "$tmpdir/rb.log")
    [ "$got" = "$want" ] && info "ok: prune $* keeps $got" ||
        check_fail "prune $* keeps '$got', expected '$want'"
}
check_prune "4 5 7" --keep-last 1 --keep-daily 2 --keep-monthly 2
check_prune "6 7" --keep-last 2
check_prune "3 4 5 7" --keep-hourly 4
check_prune "3 4 5 7" --keep-daily 10
check_prune "4 5 7" --keep-weekly 5
check_prune "5 7" --keep-monthly 3
check_prune "7" --keep-yearly 3
check_prune "2 3 4 5 6 7" --keep-last 3 --keep-hourly 3 --keep-daily 1
[ "$(repo_json "$repo" 'len(j["disks"][0]["runs"])')" -eq 7 ] || check_fail "--dry-run removed runs"

stored_before=$(repo_json "$repo" 'j["stored_bytes"]')
rb prune "$repo" --disk d1 --keep-last 1 --keep-daily 2 --keep-monthly 2 ||
    fail "prune: $(cat "$tmpdir/rb.log")"
[ "$(repo_json "$repo" '" ".join(str(r["run"]) for r in j["disks"][0]["runs"])')" = "4 5 7" ] ||
    check_fail "after prune the runs are $(repo_json "$repo" '[r["run"] for r in j["disks"][0]["runs"]]')"
for n in 4 5 7; do rb_restores "$repo" d1 $n; done
st=0; rb restore "$repo" "$tmpdir/gone.img" --disk d1 --at 2 || st=$?
rb_expect 1 "a pruned run is gone" "no run 2" "$st"
rb --json gc "$repo" --grace 0 || check_fail "gc: $(cat "$tmpdir/rb.log")"
stored_after=$(repo_json "$repo" 'j["stored_bytes"]')
[ "$stored_after" -lt "$stored_before" ] || check_fail "gc after prune freed nothing ($stored_before -> $stored_after bytes)"
for n in 4 5 7; do rb_restores "$repo" d1 $n; done
rb verify "$repo" --all || check_fail "verify after prune and gc: $(cat "$tmpdir/rb.log")"
# The next run is an incremental on run 7.
rb_run "$repo" d1 a 8
[ "$(run_field d1 8 type)" = incremental ] || check_fail "run after prune: $(cat "$tmpdir/run-d1-8.json")"

# The backup host's job (contrib/systemd/snapfg-repo-backup.sh): the
# disk, then retention and gc.
cat >"$tmpdir/job.conf" <<CONF
REPO=$repo
DISKS="d1 $ctl_a $tmpdir/sock-a"
KEEP="--keep-last 2"
CONF
st=0
SNAPFG_REPO_BACKUP_CONF="$tmpdir/job.conf" \
    "$top_srcdir/contrib/systemd/snapfg-repo-backup.sh" >"$tmpdir/job.log" 2>&1 || st=$?
[ "$st" -eq 0 ] || check_fail "the backup job: exit $st: $(cat "$tmpdir/job.log")"
[ "$(repo_json "$repo" '" ".join(str(r["run"]) for r in j["disks"][0]["runs"])')" = "8 9" ] ||
    check_fail "after the job the runs are $(repo_json "$repo" '[r["run"] for r in j["disks"][0]["runs"]]')"

# Usage: a keep option is needed; no key needed.
st=0; rb prune "$repo" || st=$?
[ "$st" -eq 2 ] || check_fail "prune without a --keep option: exit $st"

finish
