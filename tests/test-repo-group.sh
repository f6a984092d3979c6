#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup backup REPO --disk NAME -S CONTROL -u URI [--disk ...]
# into a repository (docs/repository.md): several disks at one instant,
# the hooks around the snapshots, a rollback that leaves nothing, and
# --limit-rate.  Two real snapfg servers (nbdkit), each with a control
# socket:
#
#  1. a writer writes a counter to disk a, then to disk b (each write
#     acknowledged before the next) without pause; three runs of both
#     disks meanwhile.  In every run b's counter is a's or one less,
#     every disk of every point restores byte for byte from the
#     repository, the later runs are incrementals that read only the
#     chunk the writer changes, and list (--json too) shows which runs
#     belong together (one group per instant);
#  2. hooks: --pre-snapshot and --post-snapshot with the disks, the runs'
#     numbers and the group in their environment, for two disks and for
#     one; a failing pre hook: no snapshot, no checkpoint, no index, no
#     server ever held, the post hook still runs; a wrong key refuses
#     the group before any server holds its writes;
#  3. a server killed between hold and resume, held longer than the
#     servers' timeout: the other server resumes by itself (a write
#     waiting on it completes), the run fails and is rolled back (no
#     snapshot, no new checkpoint, no index on either disk); the next run
#     after the restart is whole and leaves one checkpoint per server;
#  4. the backup host killed (SIGKILL) while writes are held: every
#     server resumes by itself at its timeout (a write waiting on each
#     completes), nothing is recorded, the next run drops what it left and
#     restores; stopped by SIGTERM it resumes the servers and drops its
#     snapshots and checkpoints itself;
#  5. --limit-rate on a backup into the repository and a restore from it:
#     accepted, the data right, no faster than the rate (a lower bound
#     only; the accuracy is measured by make bench-serve);
#  6. command lines refused (exit 2).

set -euo pipefail
source "$(dirname "$0")/repo-functions.sh"
source "$(dirname "$0")/group-functions.sh"
require_backup_tools

size=$((16 * 1024 * 1024))
CHUNK=$((4 * 1024 * 1024))
repo=$(repo_loc group)

for d in a b; do
    make_random_image "$tmpdir/$d.img" "$size"
    cp "$tmpdir/$d.img" "$tmpdir/$d.orig"
    start_snapfg "$tmpdir/$d.sock" "$tmpdir/$d.pid" origin="$tmpdir/$d.img" \
        state="$tmpdir/$d.state" control="$tmpdir/$d.ctl"
done
require_checkpoints "$tmpdir/a.ctl"
disk_args=(--disk a -S "$tmpdir/a.ctl" -u "$(uri "$tmpdir/a.sock")"
           --disk b -S "$tmpdir/b.ctl" -u "$(uri "$tmpdir/b.sock")")
rb --json init "$repo" || fail "init: $(cat "$tmpdir/rb.log")"
rid=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"][:8])' "$tmpdir/rb.log")

# runs_of DISK: how many runs list shows for DISK.
runs_of() { repo_json "$repo" 'len(j["disks"][0]["runs"])' --disk "$1"; }
# checkpoints_of D: the checkpoints on server D of this repository's
# runs (those of the encrypted one in section 2 aside).
checkpoints_of() { repo_checkpoints "$tmpdir/$1.ctl" | grep "^snapfg-repo-$rid-" || true; }
has_snapshot() { [ -n "$(repo_snapshots "$1")" ]; }
# server_clean D WHAT: server D holds no writes, has no snapshot of ours
# and exactly one checkpoint of ours (the last recorded run's).
server_clean() {
    local ctl="$tmpdir/$1.ctl"
    [ "$(stat_of "$ctl" 'd["suspended"]')" = False ] ||
        check_fail "$2: server $1 still holds writes"
    [ -z "$(repo_snapshots "$ctl")" ] ||
        check_fail "$2: server $1 keeps snapshots: $(repo_snapshots "$ctl" | tr '\n' ' ')"
    [ "$(checkpoints_of "$1" | wc -l)" -eq 1 ] ||
        check_fail "$2: server $1's checkpoints: $(checkpoints_of "$1" | tr '\n' ' ') (expected one)"
}

# =====================================================================
info "=== 1. three runs of both disks under a writer"
rm -f "$tmpdir/stop" "$tmpdir/ready"
"$PY" "$GROUP_WRITER" "$(uri "$tmpdir/a.sock")" "$(uri "$tmpdir/b.sock")" \
    "$tmpdir/stop" "$tmpdir/ready" >"$tmpdir/writer.out" &
writer_pid=$!
wait_until 30 test -e "$tmpdir/ready" || fail "the writer did not start"
for n in 1 2 3; do
    rb backup "$repo" "${disk_args[@]}" --json ||
        { cat "$tmpdir/rb.log"; fail "backup $n of both disks failed"; }
    cp "$tmpdir/rb.log" "$tmpdir/group-$n.log"
    "$PY" - "$tmpdir/rb.log" "$n" "$CHUNK" <<'PYEOF' &&
import json, sys
n, chunk = int(sys.argv[2]), int(sys.argv[3])
d = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert d["ok"] and d["group"] and d["held_ms"] >= 0, d
assert [r["disk"] for r in d["runs"]] == ["a", "b"], d
for r in d["runs"]:
    assert r["ok"] and r["run"] == n and r["group"] == d["group"], r
    # The writer changes block 0 only: after the first, each run reads
    # that one chunk (the disk's checkpoint chain works in a group).
    if n == 1:
        assert r["type"] == "full", r
    else:
        assert r["type"] == "incremental" and r["bytes_read"] == chunk, r
PYEOF
        info "ok: run $n: --json has the group, the held time and both disks' runs" ||
        { cat "$tmpdir/rb.log"; check_fail "run $n: --json"; }
    grep -q "writes held on 2 servers for" "$tmpdir/rb.log" &&
        info "run $n: $(grep -o "writes held on 2 servers for [0-9]* ms" "$tmpdir/rb.log")" ||
        check_fail "run $n: the held time is not logged"
done
touch "$tmpdir/stop"
wait "$writer_pid" || fail "the writer failed"
info "the writer wrote $(cat "$tmpdir/writer.out") counters"

for n in 1 2 3; do
    for d in a b; do
        rb restore "$repo" "$tmpdir/r$n-$d.img" --disk "$d" --at "$n" ||
            { cat "$tmpdir/rb.log"; fail "restore of disk $d run $n failed"; }
    done
    ca=$(counter "$tmpdir/r$n-a.img")
    cb=$(counter "$tmpdir/r$n-b.img")
    if [ "$cb" -eq "$ca" ] || [ "$cb" -eq $((ca - 1)) ]; then
        info "ok: run $n: a's counter $ca, b's $cb"
    else
        check_fail "run $n: a's counter $ca, b's $cb: not one instant"
    fi
    [ "$ca" -gt 0 ] || check_fail "run $n: the writer had not written yet"
    expect_disk "$tmpdir/r$n-a.img" "$tmpdir/a.orig" "$ca" "run $n: disk a restores byte for byte"
    expect_disk "$tmpdir/r$n-b.img" "$tmpdir/b.orig" "$cb" "run $n: disk b restores byte for byte"
done
[ "$(counter "$tmpdir/r1-a.img")" != "$(counter "$tmpdir/r3-a.img")" ] ||
    check_fail "runs 1 and 3 have the same counter: the writer did not run between them"

"$SNAPFG_BACKUP" --json list "$repo" >"$tmpdir/list.json" || fail "list --json"
"$PY" - "$tmpdir/list.json" "$tmpdir"/group-[123].log <<'PYEOF' &&
import json, sys
j = json.load(open(sys.argv[1]))
disks = {d["disk"]: d["runs"] for d in j["disks"]}
assert sorted(disks) == ["a", "b"], disks
a, b = disks["a"], disks["b"]
assert len(a) == len(b) == 3, (a, b)
ids = [json.loads([l for l in open(f) if l.startswith("{")][-1])["group"]
       for f in sys.argv[2:]]
for n, (x, y) in enumerate(zip(a, b)):
    assert x["group"] == y["group"] == ids[n], (x, y, ids)
    assert x["group_disks"] == y["group_disks"] == ["a", "b"], (x, y)
    assert x["held_ms"] >= 0, x
assert len(set(ids)) == 3, ids
PYEOF
    info "ok: list --json shows which runs belong together" ||
    { cat "$tmpdir/list.json"; check_fail "list --json: the runs' groups"; }
rb list "$repo" --disk a || fail "list --disk a"
gid=$("$PY" -c 'import json, sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])["group"])' "$tmpdir/group-2.log")
grep -q "GROUP" "$tmpdir/rb.log" && grep -q "^  2 .* $gid\$" "$tmpdir/rb.log" &&
    info "ok: list shows a GROUP column" ||
    check_fail "list's GROUP column: $(cat "$tmpdir/rb.log")"
for d in a b; do server_clean "$d" "after three runs"; done

# =====================================================================
info "=== 2. hooks"
hooklog="$tmpdir/hooks.log"
hook='echo "$SNAPFG_BACKUP_HOOK|$SNAPFG_BACKUP_DISKS|$SNAPFG_BACKUP_RUNS|$SNAPFG_BACKUP_GROUP|${SNAPFG_BACKUP_STATUS:-}|$SNAPFG_BACKUP_REPO|${SNAPFG_BACKUP_DIRS-none}|$SNAPFG_BACKUP_SNAPSHOTS" >>'"$hooklog"
rb backup "$repo" "${disk_args[@]}" --pre-snapshot "$hook" --post-snapshot "$hook" --json ||
    { cat "$tmpdir/rb.log"; fail "backup with hooks failed"; }
"$PY" - "$hooklog" "$repo" "$tmpdir/rb.log" <<'PYEOF' &&
import json, sys
lines = [l.rstrip("\n").split("|") for l in open(sys.argv[1])]
assert len(lines) == 2, lines
pre, post = lines
assert pre[0] == "pre" and post[0] == "post", lines
assert pre[1] == post[1] == "a b", lines
assert pre[2] == post[2] == "a=4 b=4", lines
assert pre[3] and pre[3] == post[3], lines
assert pre[4] == "" and post[4] == "ok", lines
assert pre[5] == post[5] == sys.argv[2], lines
assert pre[6] == post[6] == "none", lines
assert pre[7].startswith("a=snapfg-repo-") and " b=snapfg-repo-" in pre[7], lines
d = json.loads([l for l in open(sys.argv[3]) if l.startswith("{")][-1])
assert d["group"] == pre[3] and [r["run"] for r in d["runs"]] == [4, 4], d
PYEOF
    info "ok: the hooks ran before and after, with the disks, runs and group" ||
    { cat "$hooklog"; check_fail "the hooks' environment"; }

# A failing pre hook: nothing made anywhere, the post hook still runs.
rm -f "$hooklog"
suspends_a=$(stat_of "$tmpdir/a.ctl" 'd["suspends"]')
for d in a b; do checkpoints_of "$d" >"$tmpdir/ckpt-$d.before"; done
st=0
rb backup "$repo" "${disk_args[@]}" --pre-snapshot "exit 3" --post-snapshot "$hook" || st=$?
[ "$st" -eq 1 ] && grep -q "pre-snapshot.*failed (exit status 3)" "$tmpdir/rb.log" &&
    info "ok: a failing pre hook fails the run" ||
    { cat "$tmpdir/rb.log"; check_fail "a failing pre hook: exit $st"; }
grep -q "^post|a b|a=5 b=5|.*|failed|" "$hooklog" &&
    info "ok: the post hook ran after the failed pre hook" ||
    check_fail "the post hook did not run after a failed pre hook: $(cat "$hooklog" 2>/dev/null)"
for d in a b; do
    server_clean "$d" "a failed pre hook"
    checkpoints_of "$d" | cmp -s - "$tmpdir/ckpt-$d.before" ||
        check_fail "a failed pre hook: disk $d's checkpoint changed"
    [ "$(runs_of "$d")" -eq 4 ] || check_fail "a failed pre hook: disk $d has $(runs_of "$d") runs, expected 4"
done
[ "$(stat_of "$tmpdir/a.ctl" 'd["suspends"]')" = "$suspends_a" ] ||
    check_fail "a failing pre hook still suspended the server"
if repo_is_dir; then
    [ -z "$(ls "$repo/index/a" | grep -v '^0000000[1-4]\.idx$' || true)" ] ||
        check_fail "a failed pre hook left an index: $(ls "$repo/index/a")"
fi

# One disk with hooks: suspended around its one snapshot, recorded with
# its group.
rm -f "$hooklog"
rb -S "$tmpdir/a.ctl" -u "$(uri "$tmpdir/a.sock")" --json backup "$repo" --disk a \
    --pre-snapshot "$hook" --post-snapshot "$hook" ||
    { cat "$tmpdir/rb.log"; fail "one disk with hooks failed"; }
grep -q "^pre|a|a=5|" "$hooklog" && grep -q "^post|a|a=5|.*|ok|" "$hooklog" &&
    info "ok: one disk with hooks into a repository" ||
    check_fail "one disk with hooks: $(cat "$hooklog" 2>/dev/null)"
[ "$(stat_of "$tmpdir/a.ctl" 'd["suspends"]')" = $((suspends_a + 1)) ] ||
    check_fail "one disk with hooks: the server was not held around its snapshot"
[ "$(repo_json "$repo" 'j["disks"][0]["runs"][-1]["group"]' --disk a)" = \
  "$(cut -d'|' -f4 <"$hooklog" | head -n 1)" ] ||
    check_fail "one disk with hooks: run 5's group is not the hooks'"
[ "$(runs_of b)" -eq 4 ] || check_fail "one disk with hooks made a run of disk b"
server_clean a "one disk with hooks"

# The wrong key of an encrypted repository: refused before any server
# holds its writes.
erepo=$(repo_loc encrypted)
head -c 32 /dev/urandom >"$tmpdir/key"
head -c 32 /dev/urandom >"$tmpdir/other-key"
chmod 600 "$tmpdir/key" "$tmpdir/other-key"
rb init "$erepo" --encrypt --key-file "$tmpdir/key" || fail "init --encrypt: $(cat "$tmpdir/rb.log")"
suspends_b=$(stat_of "$tmpdir/b.ctl" 'd["suspends"]')
st=0; rb backup "$erepo" "${disk_args[@]}" --key-file "$tmpdir/other-key" --pre-snapshot "$hook" || st=$?
[ "$st" -ne 0 ] && grep -qi "key" "$tmpdir/rb.log" &&
[ "$(stat_of "$tmpdir/b.ctl" 'd["suspends"]')" = "$suspends_b" ] &&
[ -z "$(repo_snapshots "$tmpdir/b.ctl")" ] &&
    info "ok: a wrong key refuses the group before any server is held (exit $st)" ||
    check_fail "a wrong key: exit $st: $(cat "$tmpdir/rb.log")"
# The right key: an encrypted group point restores.
rb backup "$erepo" "${disk_args[@]}" --key-file "$tmpdir/key" --compress ||
    { cat "$tmpdir/rb.log"; fail "a group into an encrypted repository failed"; }
for d in a b; do
    nbdcopy "$(uri "$tmpdir/$d.sock")" "$tmpdir/now-$d.img"
    rb restore "$erepo" "$tmpdir/e-$d.img" --disk "$d" --key-file "$tmpdir/key" &&
        cmp "$tmpdir/e-$d.img" "$tmpdir/now-$d.img" &&
        info "ok: encrypted and compressed: disk $d restores byte for byte" ||
        check_fail "encrypted group: disk $d: $(cat "$tmpdir/rb.log")"
done

# =====================================================================
info "=== 3. a server killed between hold and resume"
timeouts_a=$(stat_of "$tmpdir/a.ctl" 'd["suspend_timeouts"]')
for d in a b; do checkpoints_of "$d" >"$tmpdir/ckpt-$d.before"; done
# Held 12 s, longer than the servers' 10 s: server a resumes by itself.
SNAPFG_BACKUP_TEST_HOLD_SECONDS=12 timeout 120 "$SNAPFG_BACKUP" backup "$repo" \
    "${disk_args[@]}" >"$tmpdir/bk3.log" 2>&1 &
bk_pid=$!
wait_until 30 is_suspended "$tmpdir/b.ctl" ||
    fail "server b was never suspended"
wait_until 30 has_snapshot "$tmpdir/b.ctl" ||
    fail "server b never had the run's snapshot"
kill -KILL "$(nbdkit_pid "$tmpdir/b.pid")"
wait_nbdkit_death "$tmpdir/b.pid" 10
# A write to a waits while a holds, and completes when it resumes.
timeout 60 "$PY" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\x55" * 4096, 8192); h.flush(); h.shutdown()' "$(uri "$tmpdir/a.sock")" &&
    info "ok: a write to server a completes" ||
    check_fail "a write to server a did not complete: it stays frozen"
st=0; wait "$bk_pid" || st=$?
[ "$st" -ne 0 ] && info "ok: the run fails (exit $st)" ||
    { cat "$tmpdir/bk3.log"; check_fail "the run succeeded with a server killed while holding"; }
grep -q "rolled back" "$tmpdir/bk3.log" ||
    check_fail "the run does not say it is rolled back: $(cat "$tmpdir/bk3.log")"
[ "$(stat_of "$tmpdir/a.ctl" 'd["suspend_timeouts"]')" = $((timeouts_a + 1)) ] &&
    info "ok: server a resumed by its timeout" ||
    check_fail "server a did not resume by its timeout"
server_clean a "the rolled-back run"
checkpoints_of a | cmp -s - "$tmpdir/ckpt-a.before" &&
    info "ok: server a keeps only the checkpoint it had" ||
    check_fail "the rolled-back run changed server a's checkpoints: $(checkpoints_of a | tr '\n' ' ')"
[ "$(runs_of a)" -eq 5 ] && [ "$(runs_of b)" -eq 4 ] &&
    info "ok: no index of the rolled-back run" ||
    check_fail "the rolled-back run was recorded: a $(runs_of a), b $(runs_of b) runs"
start_snapfg "$tmpdir/b.sock" "$tmpdir/b.pid" origin="$tmpdir/b.img" \
    state="$tmpdir/b.state" control="$tmpdir/b.ctl"
[ -z "$(repo_snapshots "$tmpdir/b.ctl")" ] &&
    info "ok: server b restarted without the run's (temporary) snapshot" ||
    check_fail "server b kept the killed run's snapshot: $(repo_snapshots "$tmpdir/b.ctl")"
# The next run is whole, incremental, and cleans up what the killed run
# left on b.
# (b was killed: whether its checkpoint still knows the changes is for
# the server to say, a full read otherwise; a was never interrupted.)
rb backup "$repo" "${disk_args[@]}" --json ||
    { cat "$tmpdir/rb.log"; fail "the run after the killed one failed"; }
"$PY" -c '
import json, sys
d = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert [(r["disk"], r["run"]) for r in d["runs"]] == [("a", 6), ("b", 5)], d
assert d["runs"][0]["type"] == "incremental", d' "$tmpdir/rb.log" ||
    check_fail "the run after the killed one: $(cat "$tmpdir/rb.log")"
for d in a b; do
    server_clean "$d" "the run after the killed one"
    nbdcopy "$(uri "$tmpdir/$d.sock")" "$tmpdir/now-$d.img"
    rb restore "$repo" "$tmpdir/last-$d.img" --disk "$d" &&
        cmp "$tmpdir/last-$d.img" "$tmpdir/now-$d.img" &&
        info "ok: disk $d: the run after the killed one restores byte for byte" ||
        check_fail "disk $d: the run after the killed one: $(cat "$tmpdir/rb.log")"
done

# =====================================================================
info "=== 4. the backup host killed while writes are held"
timeouts_a=$(stat_of "$tmpdir/a.ctl" 'd["suspend_timeouts"]')
SNAPFG_BACKUP_TEST_HOLD_SECONDS=60 "$SNAPFG_BACKUP" backup "$repo" \
    "${disk_args[@]}" >"$tmpdir/bk4.log" 2>&1 &
bk_pid=$!
wait_until 30 has_snapshot "$tmpdir/b.ctl" || fail "server b never had the run's snapshot"
kill -KILL "$bk_pid"
wait "$bk_pid" 2>/dev/null || true
# A write on each server waits, then completes when its server resumes
# by itself (10 s).
for d in a b; do
    timeout 60 "$PY" -c '
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"\x44" * 4096, 131072); h.flush(); h.shutdown()' "$(uri "$tmpdir/$d.sock")" &&
        info "ok: server $d takes writes again after the host died" ||
        check_fail "server $d: a write did not complete after the host died"
done
[ "$(stat_of "$tmpdir/a.ctl" 'd["suspend_timeouts"]')" = $((timeouts_a + 1)) ] ||
    check_fail "server a did not resume by its timeout"
[ "$(runs_of a)" -eq 6 ] && [ "$(runs_of b)" -eq 5 ] ||
    check_fail "the killed run was recorded: a $(runs_of a), b $(runs_of b) runs"
# The next run removes what the killed one left (its writer's process
# is gone), and is whole.
rb backup "$repo" "${disk_args[@]}" ||
    { cat "$tmpdir/rb.log"; fail "the run after the killed host failed"; }
for d in a b; do
    server_clean "$d" "the run after the killed host"
    nbdcopy "$(uri "$tmpdir/$d.sock")" "$tmpdir/now-$d.img"
    rb restore "$repo" "$tmpdir/host-$d.img" --disk "$d" &&
        cmp "$tmpdir/host-$d.img" "$tmpdir/now-$d.img" &&
        info "ok: disk $d: the run after the killed host restores byte for byte" ||
        check_fail "disk $d: the run after the killed host: $(cat "$tmpdir/rb.log")"
done
# SIGTERM: the host resumes the servers and drops its snapshots and
# checkpoints itself.
timeouts_a=$(stat_of "$tmpdir/a.ctl" 'd["suspend_timeouts"]')
for d in a b; do checkpoints_of "$d" >"$tmpdir/ckpt-$d.before"; done
SNAPFG_BACKUP_TEST_HOLD_SECONDS=60 "$SNAPFG_BACKUP" backup "$repo" \
    "${disk_args[@]}" >"$tmpdir/bk5.log" 2>&1 &
bk_pid=$!
wait_until 30 has_snapshot "$tmpdir/b.ctl" || fail "server b never had the run's snapshot"
kill -TERM "$bk_pid"
st=0; wait "$bk_pid" || st=$?
[ "$st" -ne 0 ] || check_fail "a run stopped by SIGTERM succeeded"
for d in a b; do
    server_clean "$d" "SIGTERM"
    checkpoints_of "$d" | cmp -s - "$tmpdir/ckpt-$d.before" ||
        check_fail "SIGTERM: disk $d's checkpoints changed"
done
[ "$(stat_of "$tmpdir/a.ctl" 'd["suspend_timeouts"]')" = "$timeouts_a" ] &&
    info "ok: SIGTERM: the host resumed the servers and dropped its snapshots itself" ||
    check_fail "SIGTERM: the host did not resume server a itself"
[ "$(runs_of a)" -eq 7 ] && [ "$(runs_of b)" -eq 6 ] ||
    check_fail "the run stopped by SIGTERM was recorded"

# =====================================================================
info "=== 5. --limit-rate"
nbdcopy "$(uri "$tmpdir/a.sock")" "$tmpdir/now-a.img"
t0=$(date +%s.%N)
rb -S "$tmpdir/a.ctl" -u "$(uri "$tmpdir/a.sock")" --json backup "$repo" --disk a \
    --full --limit-rate 4M || { cat "$tmpdir/rb.log"; fail "backup --limit-rate failed"; }
t1=$(date +%s.%N)
read_bytes=$("$PY" -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["bytes_read"])' "$tmpdir/rb.log")
rb restore "$repo" "$tmpdir/limited-a.img" --disk a --limit-rate 8M ||
    { cat "$tmpdir/rb.log"; fail "restore --limit-rate failed"; }
t2=$(date +%s.%N)
cmp "$tmpdir/limited-a.img" "$tmpdir/now-a.img" &&
    info "ok: --limit-rate: the run restores byte for byte" ||
    check_fail "--limit-rate: the restore differs from the disk"
"$PY" -c '
import sys
t0, t1, t2, n, size, chunk = map(float, sys.argv[1:7])
assert n == size, ("bytes read", n)
# The copy engine starts a piece (a 4 MiB chunk) while its token
# bucket is not empty and takes its bytes then: the last chunk may be
# read on credit, and a tenth of a second of burst is allowed.  The
# restore waits for each chunk it writes.  Without the limit either
# takes a fraction of a second.
assert t1 - t0 >= (n - chunk) / (4 << 20) - 0.2, ("backup", t1 - t0)
assert t2 - t1 >= size / (8 << 20) - 0.2, ("restore", t2 - t1)
' "$t0" "$t1" "$t2" "$read_bytes" "$size" "$CHUNK" &&
    info "ok: --limit-rate: backup and restore no faster than the rate" ||
    check_fail "--limit-rate: a copy was faster than the rate ($t0 $t1 $t2, $read_bytes bytes)"

# =====================================================================
info "=== 6. command lines refused"
refused() {  # WHAT PATTERN ARGS...
    local what=$1 pat=$2 st=0
    shift 2
    rb "$@" || st=$?
    rb_expect 2 "$what" "$pat" "$st"
}
A=(-S "$tmpdir/a.ctl" -u "$(uri "$tmpdir/a.sock")")
refused "a disk without its -u" "give its -S CONTROL and -u" \
    backup "$repo" --disk a "${A[@]:0:2}" --disk b "${A[@]}"
refused "a disk given twice" "given twice" backup "$repo" --disk a "${A[@]}" --disk a "${A[@]}"
refused "-S before and after --disk" "not both" "${A[@]}" backup "$repo" --disk a "${A[@]}"
refused "-S before several disks" "none before" "${A[@]:0:2}" backup "$repo" \
    --disk a -u "$(uri "$tmpdir/a.sock")" --disk b "${A[@]}"
refused "a disk's second -S" "has its -S already" backup "$repo" --disk a "${A[@]}" -S x
refused "several disks to list" "one --disk at a time" list "$repo" --disk a --disk b
refused "hooks on verify" "not this command's" verify "$repo" --pre-snapshot true
refused "--limit-rate on list" "not this command's" list "$repo" --limit-rate 1M
refused "a bad --limit-rate" "limit-rate" restore "$repo" "$tmpdir/x.img" --disk a --limit-rate 12Q
[ "$(runs_of a)" -eq 8 ] && [ "$(runs_of b)" -eq 6 ] ||
    check_fail "a refused command line made a run"

finish
