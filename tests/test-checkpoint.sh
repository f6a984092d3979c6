#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Checkpoints (changed-block tracking): exact deltas, the chain, drops,
# restarts, merges and bad input, against the real nbdkit with real
# clients.
#
# 1. Bad input: cbt-granularity= not a power of two, below chunk-size=,
#    above 1G or not a size stops nbdkit with a message naming it;
#    checkpoint commands without state= are refused saying state= is
#    needed (and create --checkpoint leaves no COW file behind); bad,
#    duplicate and unknown names are refused.
# 2. Exact deltas while a writer runs.  Four threads write, zero and
#    trim a 64 MiB origin (each on its own connection).  The writer is
#    paused just long enough to record the origin's expected image and
#    take checkpoint c1, then snapshot s2 with checkpoint c2, then s3
#    with c3, and keeps writing meanwhile and afterwards.  Then, with the
#    writer still running: changed --since c1 s2 / c1 s3 / c2 s3 equal
#    exactly the granules written between those instants (counted from
#    the writer's log of acknowledged requests), and every byte that
#    differs between the two expected images lies in them; s2 and s3
#    read back as their expected images.  After the writer stops,
#    changed --since c1 (up to now) is exact too.
# 3. The checkpoints survive a clean restart (state=): list and queries
#    are the same.
# 4. Dropping the middle checkpoint c2 keeps c1 -> s3 exact; dropping
#    the active c3 makes c1 active again, and later writes are in it.
# 5. A merge with an active checkpoint: changed --since it reports the
#    merged chunks (the snapshot's exceptions), exactly.  A new snapshot
#    under the name of a dropped one does not inherit its checkpoint.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

MiB=$((1024 * 1024))
G=65536
size=$((64 * MiB))
state="$tmpdir/state.json"
test_files "$size"


# =====================================================================
info "=== 1. bad input"
err="$tmpdir/err"
for bad in "3000:power of two" "3K:power of two" "2048:at least chunk-size" \
           "2G:at most 1G" "foo:not a valid size" "0:power of two"; do
    val=${bad%%:*} msg=${bad#*:}
    if try_start_failure "$err" origin="$origin" chunk-size=4K cbt-granularity="$val"; then
        try_stderr "$err" "cbt-granularity=" "$msg" &&
            info "ok: cbt-granularity=$val refused: $(grep -m1 cbt-granularity "$err")"
    fi
done
expect_start_success origin="$origin" chunk-size=1M cbt-granularity=1M
# The default (64K) follows a larger chunk size.
expect_start_success origin="$origin" chunk-size=256K

start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock"
ctl_refused "checkpoint create without state=" "state=FILE" "$ctlsock" checkpoint create c1
ctl_refused "checkpoint list without state=" "state=FILE" "$ctlsock" checkpoint list
ctl_refused "checkpoint drop without state=" "state=FILE" "$ctlsock" checkpoint drop c1
ctl_refused "changed --since without state=" "state=FILE" "$ctlsock" changed --since c1
ctl_refused "create --checkpoint without state=" "state=FILE" "$ctlsock" \
    create sx --cow "$tmpdir/sx.cow" --checkpoint cx
[ ! -e "$tmpdir/sx.cow" ] && info "ok: the refused create left no COW file" ||
    check_fail "the refused create --checkpoint left $tmpdir/sx.cow behind"
ctl "$ctlsock" status sx && check_fail "snapshot sx exists after a refused create --checkpoint" || true
stop_nbdkit "$pid"

# =====================================================================
info "=== 2. exact deltas while a writer runs"
start_snapfg "$sock" "$pid" origin="$origin" state="$state" control="$ctlsock"
ctl_refused "a name with a slash" "checkpoint name" "$ctlsock" checkpoint create a/b
ctl_refused "a name starting with a dot" "checkpoint name" "$ctlsock" checkpoint create .hidden
ctl_refused "drop of an unknown checkpoint" "no checkpoint named" "$ctlsock" checkpoint drop nope
ctl_refused "changed since an unknown checkpoint" "no checkpoint named" "$ctlsock" changed --since nope
ctl_ok "checkpoint list (empty)" "$ctlsock" --json checkpoint list
[ "$(jq_py "$tmpdir/ctl.out" 'len(d["checkpoints"])')" = 0 ] ||
    check_fail "a new catalogue lists checkpoints: $(cat "$tmpdir/ctl.out")"

wd="$tmpdir/writer"
mkdir -p "$wd"
cp "$origin" "$tmpdir/model-start.img"
ckio writer "$(uri "$sock" origin)" --size "$size" --dir "$wd" \
    --model "$tmpdir/model-start.img" --seed 7 --threads 4 \
    >"$tmpdir/writer.out" 2>&1 &
writer_pid=$!
on_exit "touch '$wd/stop'; wait $writer_pid 2>/dev/null"

# pause_writer K: wait until the writer is quiet with its model saved.
pause_writer() {
    touch "$wd/pause-$1"
    wait_until 120 test -e "$wd/paused-$1" ||
        fail "the writer did not pause (pause $1): $(cat "$tmpdir/writer.out")"
}
resume_writer() { touch "$wd/resume-$1"; }
# acked_at_least LOG N: LOG holds at least N acknowledged requests.
acked_at_least() {
    local n
    n=$(grep -c '^A' "$1" 2>/dev/null) || n=0
    [ "$n" -ge "$2" ]
}
# some_writes N: let the writer make at least N more requests.
some_writes() {
    local before
    before=$(grep -c '^A' "$wd/ops.log" 2>/dev/null) || before=0
    wait_until 120 acked_at_least "$wd/ops.log" $((before + $1)) ||
        fail "the writer stopped writing: $(cat "$tmpdir/writer.out")"
}

some_writes 20
pause_writer 1
ctl_ok "checkpoint create c1 (the writer paused)" "$ctlsock" checkpoint create c1
resume_writer 1
some_writes 60
pause_writer 2
ctl_ok "create s2 --checkpoint c2" "$ctlsock" create s2 --cow "$tmpdir/s2.cow" --checkpoint c2
resume_writer 2
some_writes 60
pause_writer 3
ctl_ok "create s3 --checkpoint c3" "$ctlsock" create s3 --cow "$tmpdir/s3.cow" --checkpoint c3
resume_writer 3
some_writes 40

ctl_refused "a duplicate checkpoint name" "already exists" "$ctlsock" checkpoint create c1
ctl_refused "create with a duplicate checkpoint name" "already exists" "$ctlsock" \
    create s4 --cow "$tmpdir/s4.cow" --checkpoint c2
ctl "$ctlsock" status s4 && check_fail "s4 exists after its create was refused" || true
[ ! -e "$tmpdir/s4.cow" ] || check_fail "the refused create left $tmpdir/s4.cow behind"
ctl_refused "changed from a checkpoint newer than the snapshot" "newer than" "$ctlsock" \
    changed --since c3 s2
ctl_refused "changed up to a snapshot without a checkpoint" "not created with a checkpoint" \
    "$ctlsock" changed --since c1 nosuch

# check_delta WHAT FROM TO SINCE [SNAPSHOT]: changed --since SINCE
# [SNAPSHOT] equals the granules written between pauses FROM and TO, and
# covers every byte that differs between the models saved there.
check_delta() {
    local what=$1 from=$2 to=$3
    shift 3
    ckio expect-ranges "$wd/ops.log" --granularity "$G" --size "$size" \
        --from "$from" --to "$to" >"$tmpdir/expect.json"
    if ! ctl "$ctlsock" --json changed --since "$@"; then
        check_fail "$what: changed --since $* failed: $(cat "$tmpdir/ctl.err")"
        return 0
    fi
    json_ok "$what" "$tmpdir/ctl.out"
    if ckio check-changed "$tmpdir/ctl.out" --expect "$tmpdir/expect.json" \
        --old "$wd/model-$from.img" --new "$wd/model-$to.img" >"$tmpdir/check.out" 2>&1; then
        info "ok: $what: $(tr '\n' ';' <"$tmpdir/check.out")"
    else
        check_fail "$what: $(cat "$tmpdir/check.out")"
    fi
}

info "queries while the writer keeps writing"
check_delta "c1 -> s2" 1 2 c1 s2
check_delta "c1 -> s3" 1 3 c1 s3
check_delta "c2 -> s3" 2 3 c2 s3
ctl_ok "changed --since c3 s3 (the same instant)" "$ctlsock" --json changed --since c3 s3
[ "$(jq_py "$tmpdir/ctl.out" '[d["bytes"], d["ranges"], d["since"], d["name"], d["granularity"]]')" = '[0, [], "c3", "s3", 65536]' ] ||
    check_fail "changed --since c3 s3 is not empty: $(cat "$tmpdir/ctl.out")"
ctl_ok "changed --since c1 s2 (human)" "$ctlsock" changed --since c1 s2
grep -q '^# [0-9]* ranges, [0-9]* bytes changed$' "$tmpdir/ctl.out" ||
    check_fail "human changed --since lacks its summary line: $(tail -n1 "$tmpdir/ctl.out")"
export_equals "$(uri "$sock" s2)" "$wd/model-2.img" "s2 reads as the origin at its instant"
export_equals "$(uri "$sock" s3)" "$wd/model-3.img" "s3 reads as the origin at its instant"

touch "$wd/stop"
wait "$writer_pid" || fail "the writer failed: $(cat "$tmpdir/writer.out")"
grep -q '^E' "$wd/ops.log" && fail "a write failed: $(grep -m1 '^E' "$wd/ops.log")"
info "writer: $(grep -c '^A' "$wd/ops.log") acknowledged requests"
nbdcopy -- "$(uri "$sock" origin)" "$tmpdir/origin-now.img"
files_equal "$tmpdir/origin-now.img" "$wd/model-end.img" "the origin equals the writer's model"
check_delta "c1 -> now" 1 end c1
check_delta "c3 -> now" 3 end c3

ctl_ok "checkpoint list --json" "$ctlsock" --json checkpoint list
json_ok "checkpoint list --json" "$tmpdir/ctl.out"
got=$(jq_py "$tmpdir/ctl.out" '[(c["name"], c["state"], c["snapshot"], c["granularity"]) for c in d["checkpoints"]]')
[ "$got" = '[["c1", "frozen", null, 65536], ["c2", "frozen", "s2", 65536], ["c3", "active", "s3", 65536]]' ] &&
    info "ok: checkpoint list: $got" || check_fail "checkpoint list: $got"
jq_py "$tmpdir/ctl.out" 'all(d["checkpoints"][i]["seq"] < d["checkpoints"][i+1]["seq"] for i in range(2)) and all(c["created"] > 1500000000 for c in d["checkpoints"])' |
    grep -qx true || check_fail "seq not increasing or created not a time: $(cat "$tmpdir/ctl.out")"
ckio expect-ranges "$wd/ops.log" --granularity "$G" --size "$size" --from 1 --to 2 >"$tmpdir/expect.json"
want=$("$PY" -c 'import json,sys; print(sum(n for _, n in json.load(open(sys.argv[1]))))' "$tmpdir/expect.json")
[ "$(jq_py "$tmpdir/ctl.out" 'd["checkpoints"][0]["dirty_bytes"]')" = "$want" ] ||
    check_fail "c1's dirty_bytes is not $want: $(cat "$tmpdir/ctl.out")"
ctl_ok "checkpoint list (human)" "$ctlsock" checkpoint list
grep -q '^c2	frozen	seq 2	granularity 65536	.*snapshot s2$' "$tmpdir/ctl.out" ||
    check_fail "human checkpoint list: $(cat "$tmpdir/ctl.out")"
for f in c1 c2 c3; do
    [ -f "$state.d/$f.cbt" ] || check_fail "no bitmap $state.d/$f.cbt"
done

# =====================================================================
info "=== 3. a clean restart keeps every checkpoint"
ctl_ok "drop s2" "$ctlsock" drop s2
ctl_ok "drop s3" "$ctlsock" drop s3
cp "$tmpdir/ctl.out" "$tmpdir/list-before"
ctl "$ctlsock" --json checkpoint list && cp "$tmpdir/ctl.out" "$tmpdir/list-before"
stop_nbdkit "$pid"
start_snapfg "$sock" "$pid" origin="$origin" state="$state" control="$ctlsock"
ctl_ok "checkpoint list after the restart" "$ctlsock" --json checkpoint list
cmp -s "$tmpdir/ctl.out" "$tmpdir/list-before" && info "ok: the list is the same" ||
    check_fail "the list changed across a restart: $(cat "$tmpdir/list-before") -> $(cat "$tmpdir/ctl.out")"
check_delta "c1 -> s3 after the restart" 1 3 c1 s3
check_delta "c1 -> now after the restart" 1 end c1

# =====================================================================
info "=== 4. drops"
ctl_ok "drop the middle checkpoint c2" "$ctlsock" checkpoint drop c2
check_delta "c1 -> s3 after dropping c2" 1 3 c1 s3
check_delta "c1 -> now after dropping c2" 1 end c1
ctl_refused "changed up to s2, whose checkpoint is gone" "checkpoint was dropped" \
    "$ctlsock" changed --since c1 s2
[ ! -e "$state.d/c2.cbt" ] || check_fail "c2's bitmap is still there"
ctl_ok "drop the active checkpoint c3" "$ctlsock" checkpoint drop c3
ctl "$ctlsock" --json checkpoint list
[ "$(jq_py "$tmpdir/ctl.out" '[(c["name"], c["state"]) for c in d["checkpoints"]]')" = '[["c1", "active"]]' ] ||
    check_fail "after dropping c3, c1 is not the active one: $(cat "$tmpdir/ctl.out")"
# c1 tracks again: a second writer's requests show up in it.
wd2="$tmpdir/writer2"
mkdir -p "$wd2"
ckio writer "$(uri "$sock" origin)" --size "$size" --dir "$wd2" \
    --model "$wd/model-end.img" --seed 8 --threads 2 >"$tmpdir/writer2.out" 2>&1 &
w2=$!
wait_until 120 acked_at_least "$wd2/ops.log" 30 ||
    fail "the second writer does not write: $(cat "$tmpdir/writer2.out")"
touch "$wd2/stop"
wait "$w2" || fail "the second writer failed: $(cat "$tmpdir/writer2.out")"
{ grep -v '^P end$' "$wd/ops.log"; cat "$wd2/ops.log"; } >"$tmpdir/both.log"
ckio expect-ranges "$tmpdir/both.log" --granularity "$G" --size "$size" --from 1 >"$tmpdir/expect.json"
ctl "$ctlsock" --json changed --since c1 || true
ckio check-changed "$tmpdir/ctl.out" --expect "$tmpdir/expect.json" \
    --old "$wd/model-1.img" --new "$wd2/model-end.img" >"$tmpdir/check.out" 2>&1 &&
    info "ok: c1 -> now, after c3 was dropped and more writes: $(tr '\n' ';' <"$tmpdir/check.out")" ||
    check_fail "c1 -> now after dropping c3: $(cat "$tmpdir/check.out")"

# =====================================================================
info "=== 5. a merge with an active checkpoint"
ctl_ok "create m (persistent, 4K chunks)" "$ctlsock" create m --cow "$tmpdir/m.cow" --chunk-size 4096
# Origin writes after m (copy-outs) and writes to m itself: m's exceptions.
"$PY" - "$(uri "$sock" origin)" "$(uri "$sock" m)" <<'EOF'
import nbd, sys
for uri, writes in ((sys.argv[1], [(3 * 65536 + 4096, 4096), (40 * 65536, 70000 // 512 * 512)]),
                    (sys.argv[2], [(100 * 65536 + 512, 1024), (900 * 65536, 8192)])):
    h = nbd.NBD(); h.connect_uri(uri)
    for off, n in writes:
        h.pwrite(b"\xa5" * n, off)
    h.flush(); h.shutdown()
EOF
ctl_ok "checkpoint create cm" "$ctlsock" checkpoint create cm
nbdcopy -- "$(uri "$sock" origin)" "$tmpdir/pre-merge.img"
nbdcopy -- "$(uri "$sock" m)" "$tmpdir/m-view.img"
ctl_ok "merge m" "$ctlsock" merge m
wait_until 120 sh -c "! '$SNAPFGCTL' -S '$ctlsock' status m >/dev/null 2>&1" ||
    check_fail "the merge of m did not finish"
export_equals "$(uri "$sock" origin)" "$tmpdir/m-view.img" "after the merge the origin is m's view"
nbdcopy -- "$(uri "$sock" origin)" "$tmpdir/post-merge.img"
# m's exceptions, in 64K granules: origin writes at granules 3, 40-41;
# snapshot writes at 100, 900.
echo '[[196608, 65536], [2621440, 131072], [6553600, 65536], [58982400, 65536]]' >"$tmpdir/expect.json"
ctl "$ctlsock" --json changed --since cm || true
ckio check-changed "$tmpdir/ctl.out" --expect "$tmpdir/expect.json" \
    --old "$tmpdir/pre-merge.img" --new "$tmpdir/post-merge.img" >"$tmpdir/check.out" 2>&1 &&
    info "ok: cm -> after the merge: $(tr '\n' ';' <"$tmpdir/check.out")" ||
    check_fail "cm -> after the merge: $(cat "$tmpdir/check.out")"


# A new snapshot under an old name does not inherit the old one's
# checkpoint: changed up to it is refused, not answered for the old one.
ctl_ok "create r --checkpoint cr" "$ctlsock" create r --cow "$tmpdir/r.cow" --checkpoint cr
ctl_ok "changed --since cm r" "$ctlsock" changed --since cm r
ctl_ok "drop r" "$ctlsock" drop r
ctl_ok "create r again, without a checkpoint" "$ctlsock" create r --cow "$tmpdir/r2.cow"
ctl_refused "changed up to the new r" "not created with a checkpoint" "$ctlsock" changed --since cm r
ctl "$ctlsock" --json checkpoint list
[ "$(jq_py "$tmpdir/ctl.out" '[c["snapshot"] for c in d["checkpoints"] if c["name"] == "cr"]')" = '[null]' ] ||
    check_fail "cr still names snapshot r: $(cat "$tmpdir/ctl.out")"

stop_nbdkit "$pid"
finish
