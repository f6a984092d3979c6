#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfg-backup backup of several disks at one instant (--disk NAME -S
# CONTROL -u URI, repeated), the hooks around the snapshots, and what
# happens when a server or the backup host dies while writes are held.
# Two real snapfg servers (nbdkit), each with a control socket:
#
#  1. a writer writes a counter to disk a, then to disk b (each write
#     acknowledged before the next) without pause; three backups of both
#     disks run meanwhile.  In every run b's counter is a's or one less,
#     and every disk of every run restores byte for byte (the origin as
#     made, with the counter block); both disks' runs carry one group id
#     (list --json), and the time writes were held is in --json;
#  2. hooks: --pre-snapshot and --post-snapshot run with the run's disks,
#     runs and group in their environment; a failing pre hook aborts the
#     run: no snapshot left on either server, no run recorded, the post
#     hook still runs (SNAPFG_BACKUP_STATUS=failed);
#  3. a server killed between hold and resume: the run fails and is
#     rolled back; the other server is resumed and keeps no snapshot;
#  4. the backup host (snapfg-backup) killed with SIGKILL while writes
#     are held: every server resumes by itself at its timeout (a write
#     waiting on each completes); the next run leaves no snapshot behind
#     and restores; killed with SIGTERM: it resumes the servers and
#     drops its snapshots itself.
set -euo pipefail
source "$(dirname "$0")/backup-functions.sh"
source "$(dirname "$0")/group-functions.sh"
require_backup_tools

size=$((16 * 1024 * 1024))
repo="$tmpdir/repo"
writer=$GROUP_WRITER

# Server b is killed with SIGKILL in section 3 and started again with
# the default writeback=on: its held file, bound to the run's temporary
# snapshot (which the restart drops), must not stand in the way.
declare -A wb=([a]=on [b]=on)
for d in a b; do
    make_random_image "$tmpdir/$d.img" "$size"
    cp "$tmpdir/$d.img" "$tmpdir/$d.orig"
    start_snapfg "$tmpdir/$d.sock" "$tmpdir/$d.pid" origin="$tmpdir/$d.img" \
        state="$tmpdir/$d.state" control="$tmpdir/$d.ctl" writeback="${wb[$d]}"
done
require_checkpoints "$tmpdir/a.ctl"
disk_args=(--disk a -S "$tmpdir/a.ctl" -u "$(uri "$tmpdir/a.sock")"
           --disk b -S "$tmpdir/b.ctl" -u "$(uri "$tmpdir/b.sock")")

# snapshots_left CTL: the snapfg-backup snapshots on a server.
snapshots_left() { our_snapshots "$1" | wc -l; }

# =====================================================================
info "=== 1. three runs of both disks under a writer"
rm -f "$tmpdir/stop" "$tmpdir/ready"
"$PY" "$writer" "$(uri "$tmpdir/a.sock")" "$(uri "$tmpdir/b.sock")" \
    "$tmpdir/stop" "$tmpdir/ready" >"$tmpdir/writer.out" &
writer_pid=$!
wait_until 30 test -e "$tmpdir/ready" || fail "the writer did not start"
for n in 1 2 3; do
    bk backup "$repo" "${disk_args[@]}" --json ||
        { cat "$tmpdir/bk.log"; fail "backup $n of both disks failed"; }
    "$PY" -c '
import json, sys
d = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert d["ok"] and d["group"] and d["held_ms"] >= 0, d
assert [r["disk"] for r in d["runs"]] == ["a", "b"], d
assert all(r["seq"] == int(sys.argv[2]) for r in d["runs"]), d' \
        "$tmpdir/bk.log" "$n" && info "ok: run $n: --json has the group, the held time and both runs" ||
        { cat "$tmpdir/bk.log"; check_fail "run $n: --json"; }
    grep -q "writes held on 2 servers for" "$tmpdir/bk.log" ||
        check_fail "run $n: the held time is not logged"
done
touch "$tmpdir/stop"
wait "$writer_pid" || fail "the writer failed"
info "the writer wrote $(cat "$tmpdir/writer.out") counters"

for n in 1 2 3; do
    for d in a b; do
        bk restore "$repo" "$tmpdir/r$n-$d.img" --disk "$d" --at "$n" ||
            { cat "$tmpdir/bk.log"; fail "restore of disk $d run $n failed"; }
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

for d in a b; do
    bk list "$repo" --disk "$d" --json || fail "list --disk $d"
    cp "$tmpdir/bk.log" "$tmpdir/list-$d.json"
done
"$PY" -c '
import json, sys
a = json.load(open(sys.argv[1]))["runs"]
b = json.load(open(sys.argv[2]))["runs"]
assert len(a) == len(b) == 3
for x, y in zip(a, b):
    assert x["group"] and x["group"] == y["group"], (x, y)
    assert x["group_disks"] == ["a", "b"]
assert len(set(x["group"] for x in a)) == 3' "$tmpdir/list-a.json" "$tmpdir/list-b.json" &&
    info "ok: list shows which runs belong together" ||
    check_fail "list: the runs' groups do not match"
bk list "$repo" --disk a && grep -q "GROUP" "$tmpdir/bk.log" ||
    check_fail "list does not show a GROUP column"
for d in a b; do
    [ "$(snapshots_left "$tmpdir/$d.ctl")" = 0 ] || check_fail "disk $d: snapshots left"
done

# =====================================================================
info "=== 2. hooks"
hooklog="$tmpdir/hooks.log"
hook='echo "$SNAPFG_BACKUP_HOOK|$SNAPFG_BACKUP_DISKS|$SNAPFG_BACKUP_RUNS|$SNAPFG_BACKUP_GROUP|${SNAPFG_BACKUP_STATUS:-}" >>'"$hooklog"
bk backup "$repo" "${disk_args[@]}" --pre-snapshot "$hook" --post-snapshot "$hook" ||
    { cat "$tmpdir/bk.log"; fail "backup with hooks failed"; }
"$PY" -c '
import sys
lines = [l.rstrip("\n").split("|") for l in open(sys.argv[1])]
assert len(lines) == 2, lines
pre, post = lines
assert pre[0] == "pre" and post[0] == "post", lines
assert pre[1] == post[1] == "a b", lines
assert pre[2] == post[2] == "a=4 b=4", lines
assert pre[3] and pre[3] == post[3], lines
assert pre[4] == "" and post[4] == "ok", lines' "$hooklog" &&
    info "ok: the hooks ran before and after, with the disks, runs and group" ||
    { cat "$hooklog"; check_fail "the hooks' environment"; }

rm -f "$hooklog"
st=0
bk backup "$repo" "${disk_args[@]}" --pre-snapshot "exit 3" --post-snapshot "$hook" || st=$?
[ "$st" -eq 1 ] && grep -q "pre-snapshot.*failed (exit status 3)" "$tmpdir/bk.log" &&
    info "ok: a failing pre hook fails the run" ||
    { cat "$tmpdir/bk.log"; check_fail "a failing pre hook: exit $st"; }
grep -q "^post|a b|a=5 b=5|.*|failed$" "$hooklog" &&
    info "ok: the post hook ran after the failed pre hook" ||
    check_fail "the post hook did not run after a failed pre hook: $(cat "$hooklog" 2>/dev/null)"
for d in a b; do
    [ "$(snapshots_left "$tmpdir/$d.ctl")" = 0 ] || check_fail "disk $d: a snapshot left by the failed hook"
    [ "$(stat_of "$tmpdir/$d.ctl" 'd["suspended"]')" = False ] || check_fail "disk $d: left suspended"
    [ "$(manifest_field "$repo/$d" 5 seq 2>/dev/null || true)" = "" ] ||
        check_fail "disk $d: the failed run was recorded"
done
[ "$(stat_of "$tmpdir/a.ctl" 'd["suspends"]')" = 4 ] ||
    check_fail "a failing pre hook still suspended the server"

# =====================================================================
info "=== 3. a server killed between hold and resume"
st=0
SNAPFG_BACKUP_TEST_HOLD_SECONDS=4 timeout 120 "$SNAPFG_BACKUP" backup "$repo" \
    "${disk_args[@]}" >"$tmpdir/bk3.log" 2>&1 &
bk_pid=$!
wait_until 30 is_suspended "$tmpdir/b.ctl" ||
    fail "server b was never suspended"
kill -KILL "$(nbdkit_pid "$tmpdir/b.pid")"
wait_nbdkit_death "$tmpdir/b.pid" 10
wait "$bk_pid" || st=$?
[ "$st" -ne 0 ] && info "ok: the run fails (exit $st)" ||
    check_fail "the run succeeded with a server killed while holding"
[ "$(stat_of "$tmpdir/a.ctl" 'd["suspended"]')" = False ] &&
    info "ok: server a is resumed" || check_fail "server a stays suspended"
[ "$(snapshots_left "$tmpdir/a.ctl")" = 0 ] &&
    info "ok: server a keeps no snapshot of the failed run" ||
    check_fail "server a keeps a snapshot of the failed run"
fill_export "$(uri "$tmpdir/a.sock")" 65536 4096 0x33 || check_fail "server a does not take writes"
[ "$(manifest_field "$repo/a" 5 seq 2>/dev/null || true)" = "" ] ||
    check_fail "disk a: the failed run was recorded"
start_snapfg "$tmpdir/b.sock" "$tmpdir/b.pid" origin="$tmpdir/b.img" \
    state="$tmpdir/b.state" control="$tmpdir/b.ctl"

# =====================================================================
info "=== 4. the backup host killed while writes are held"
SNAPFG_BACKUP_TEST_HOLD_SECONDS=60 "$SNAPFG_BACKUP" backup "$repo" \
    "${disk_args[@]}" >"$tmpdir/bk4.log" 2>&1 &
bk_pid=$!
wait_until 30 is_suspended "$tmpdir/b.ctl" ||
    fail "server b was never suspended"
timeouts_a=$(stat_of "$tmpdir/a.ctl" 'd["suspend_timeouts"]')
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
    [ "$(stat_of "$tmpdir/$d.ctl" 'd["suspended"]')" = False ] ||
        check_fail "server $d stays suspended"
done
[ "$(stat_of "$tmpdir/a.ctl" 'd["suspend_timeouts"]')" = $((timeouts_a + 1)) ] &&
    info "ok: server a resumed by its timeout" || check_fail "server a did not time out"
grep -q "ended by its timeout" "$tmpdir/a.pid.log" || check_fail "the timeout is not logged"
# The next run removes what the killed one left.
bk backup "$repo" "${disk_args[@]}" ||
    { cat "$tmpdir/bk.log"; fail "the run after the killed one failed"; }
for d in a b; do
    [ "$(snapshots_left "$tmpdir/$d.ctl")" = 0 ] &&
        info "ok: disk $d: no snapshot left behind" ||
        check_fail "disk $d: snapshots left: $(our_snapshots "$tmpdir/$d.ctl")"
    seq=$(manifest_field "$repo/$d" 5 seq)
    bk restore "$repo" "$tmpdir/r5-$d.img" --disk "$d" --at 5 ||
        check_fail "disk $d: run 5 does not restore"
    nbdcopy "$(uri "$tmpdir/$d.sock")" "$tmpdir/now-$d.img"
    cmp "$tmpdir/r5-$d.img" "$tmpdir/now-$d.img" &&
        info "ok: disk $d: run $seq restores the disk" ||
        check_fail "disk $d: run 5 differs from the disk"
done

# SIGTERM: the host resumes the servers and drops its snapshots itself.
timeouts_a=$(stat_of "$tmpdir/a.ctl" 'd["suspend_timeouts"]')
SNAPFG_BACKUP_TEST_HOLD_SECONDS=60 "$SNAPFG_BACKUP" backup "$repo" \
    "${disk_args[@]}" >"$tmpdir/bk5.log" 2>&1 &
bk_pid=$!
wait_until 30 is_suspended "$tmpdir/b.ctl" ||
    fail "server b was never suspended"
kill -TERM "$bk_pid"
st=0; wait "$bk_pid" || st=$?
[ "$st" -ne 0 ] || check_fail "a run stopped by SIGTERM succeeded"
for d in a b; do
    [ "$(stat_of "$tmpdir/$d.ctl" 'd["suspended"]')" = False ] &&
    [ "$(snapshots_left "$tmpdir/$d.ctl")" = 0 ] &&
        info "ok: SIGTERM: disk $d resumed, no snapshot left" ||
        check_fail "SIGTERM: disk $d suspended or with a snapshot left"
done
[ "$(stat_of "$tmpdir/a.ctl" 'd["suspend_timeouts"]')" = "$timeouts_a" ] ||
    check_fail "SIGTERM: the host did not resume server a itself"

finish
