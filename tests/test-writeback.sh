#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Write-back of first writes (writeback=on, the default), against a real
# nbdkit with libnbd clients, checking data byte for byte through NBD and
# in the origin file itself.  SNAPFG_TEST_WRITEBACK_PAUSE=FILE holds the
# committer while FILE exists, so that "held" is a state the test sets,
# not a race it hopes to win.
#
#  1. Held writes: read-your-writes across two connections, overwrites of
#     a held chunk in order, a zero and a multi-chunk write; the snapshot
#     unchanged; nothing on the origin file while held; FUA on the file
#     when it returns; after a flush the file holds every write.  A FUA
#     write over a held one.  Stats show what is held; the held data is
#     in the held-data memory file, which gives its pages back once
#     nothing is held.  A restart finds the snapshot pristine and the
#     origin as written.
#  1b. Reads of held writes of every size (the read index): writes and
#     zeroes from 512 bytes to over 4 MiB, overlapping, on two
#     connections, each followed by a read that must match the model.
#  2. Backpressure: writeback-max=64K and the committer paused: a writer
#     waits for room (stats), never fails; held bytes stay within the
#     limit; once the committer goes on every write lands.
#  2b. No memory to hold a write (SNAPFG_TEST_FAIL_AT=held-data): the
#     request still succeeds.  A first write goes the way writeback=off
#     takes (on the origin file when it returns, the committer paused),
#     and a write over a held one waits until that is applied and lands
#     after it; logged; after a flush the file is right.
#  3. A clean stop applies and syncs everything held.
#  3b. The committer's copies go into the COW file with O_DIRECT where
#     its file system takes it (an open file with O_DIRECT on the COW
#     file), buffered where it does not; byte for byte right either way.
#     On the test directory's file system and on /dev/shm (tmpfs, which
#     takes O_DIRECT since Linux 6.6: the test asks it first).
#  4. A failed origin write after the acknowledgement (an NBD origin
#     whose writes fail on demand): the next flush on every connection
#     fails with EIO, once; the snapshot stays valid.
#  4b. A failed origin read in the committer's copy (an NBD origin whose
#     reads fail on demand): a write still copying out fails with EIO;
#     an acknowledged one is dropped, logged, and the next flush on
#     every connection fails with EIO, once; the snapshot stays valid.
#  5. A failed commit after the acknowledgement (an NBD COW whose flush
#     fails on demand): the snapshot becomes Invalid, the origin write
#     goes ahead.
#  6. writeback=off: every acknowledged write is on the origin file at
#     once (today's behaviour), and stats say off.
#  7. Stores whose commit waits for no sync (store=transient,
#     durability=flush) are not held for under writeback=on: their
#     first writes are on the origin file at once, nothing is held.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
requires nbdkit

WBIO="$(dirname "$0")/writeback-io.py"
wbio() { "$PY" "$WBIO" "$@" >"$tmpdir/wbio.out" 2>&1; local st=$?; report; return $st; }
# report: each "ok"/"BAD" line of the last wbio run.
report() {
    local verdict rest
    while read -r verdict rest; do
        case $verdict in
            ok) info "ok: $rest" ;;
            BAD) check_fail "$rest" ;;
            *) echo "$verdict $rest" >&2 ;;
        esac
    done <"$tmpdir/wbio.out"
}

test_files
test_seed
origin="$tmpdir/origin.img"
cow="$tmpdir/cow.img"
pristine="$tmpdir/pristine.img"
model="$tmpdir/model.img"
pause="$tmpdir/pause"
ctlsock="$tmpdir/ctl.sock"
size=$((16 * 1024 * 1024))

fresh() {
    make_random_image "$origin" "$size"
    cp "$origin" "$pristine"
    cp "$origin" "$model"
    rm -f "$cow" "$ctlsock"
}

# model_write OFFSET LENGTH BYTE: what a write of BYTE makes of the model.
model_write() {
    "$PY" - "$model" "$1" "$2" "$3" <<'EOF'
import sys
path, off, n, byte = sys.argv[1], int(sys.argv[2], 0), int(sys.argv[3], 0), int(sys.argv[4], 0)
m = bytearray(open(path, "rb").read())
m[off:off + n] = bytes([byte]) * n
open(path, "wb").write(m)
EOF
}

# stat_field KEY: the origin export's KEY in snapfgctl stats --json.
stat_field() {
    "$SNAPFGCTL" --socket "$ctlsock" stats --json >"$tmpdir/stats.json" ||
        return 1
    jq_py "$tmpdir/stats.json" \
        "[x for x in d['exports'] if x['export'] == 'origin'][0]['$1']"
}

# held_file_kib: the KiB of the server's held file (held data lives
# there, on tmpfs, not in the heap: held-file.c), or nothing if it has
# none.
held_file_kib() {
    local f
    for f in /proc/"$(cat "$pid")"/fd/*; do
        case $(readlink "$f" 2>/dev/null) in
            */snapfg-held-*) echo $(( $(stat -L -c %b "$f") / 2 )); return ;;
        esac
    done
}

# ---- 1. held writes ---------------------------------------------------
info "=== 1. held writes, read-your-writes, order, FUA, flush"
fresh
touch "$pause"
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" start_snapfg "$sock" "$pid" \
    origin="$origin" cow="$cow" control="$ctlsock" writeback=on
# Held now, with the committer paused: the stats say so.
wbio write "$sock" 0x100000 4096 0x5a || check_fail "a first write failed"
model_write 0x100000 4096 0x5a
held=$(stat_field writeback_held_bytes)
[ "$held" -gt 4096 ] && info "ok: stats: $held bytes held" ||
    check_fail "stats: writeback_held_bytes is $held with a write held"
[ "$(stat_field writeback)" = true ] || check_fail "stats: writeback is not on"
kib=$(held_file_kib)
[ -n "$kib" ] && [ "$kib" -ge 4 ] && info "ok: the held file has $kib KiB" ||
    check_fail "the held write is not in the held file ('$kib' KiB)"
"$SNAPFGCTL" --socket "$ctlsock" stats >"$tmpdir/stats.txt"
# The default writeback-max: a sixteenth of the memory in whole MiB,
# from 64M to 1G.
mem=$(( $(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) * 1024 ))
want_max=$(( mem / 16 / 1048576 * 1048576 ))
[ "$want_max" -ge 67108864 ] || want_max=67108864
[ "$want_max" -le 1073741824 ] || want_max=1073741824
grep -q "^write-back on (max $want_max bytes): [0-9]* bytes held" "$tmpdir/stats.txt" &&
    info "ok: snapfgctl stats prints the write-back line" ||
    check_fail "snapfgctl stats: no write-back line: $(cat "$tmpdir/stats.txt")"
"$SNAPFGCTL" --socket "$ctlsock" stats --prometheus >"$tmpdir/prom.txt"
for m in writeback_held_bytes writeback_commit_rounds_total \
         writeback_round_exceptions_total writeback_waiting_writers; do
    grep -q "^snapfg_${m}{export=\"origin\"} [0-9]" "$tmpdir/prom.txt" &&
        info "ok: prometheus: snapfg_$m" ||
        check_fail "prometheus: no snapfg_$m sample for the origin"
done
wbio held "$sock" "$origin" "$pristine" "$model" "$pause" || true
rounds=$(stat_field writeback_commit_rounds)
[ "$rounds" -ge 1 ] && info "ok: stats: $rounds commit rounds" ||
    check_fail "stats: writeback_commit_rounds is $rounds after a flush"
[ "$(stat_field writeback_held_bytes)" = 0 ] ||
    check_fail "stats: bytes still held after a flush"
# With nothing held the file keeps its header, its applied mark and the
# ring's current page of records: 12 KiB, no data.
kib=$(held_file_kib)
[ -n "$kib" ] && [ "$kib" -le 12 ] && info "ok: the held file gave its data pages back ($kib KiB left: header, mark, records)" ||
    check_fail "the held file keeps '$kib' KiB with nothing held (more than its 12 KiB of header, mark and records)"
wbio fua-after-held "$sock" "$origin" "$model" || true
export_equals "$(uri "$sock" snapshot)" "$pristine" "snapshot == pristine"
export_equals "$(uri "$sock" origin)" "$model" "origin export == model"
stop_nbdkit "$pid"
files_equal "$origin" "$model" "origin file after the stop"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
export_equals "$(uri "$sock" snapshot)" "$pristine" "restarted: snapshot == pristine"
stop_nbdkit "$pid"

# ---- 1b. reads of held writes of every size ----------------------------
info "=== 1b. reads of held writes of every size"
fresh
touch "$pause"
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" start_snapfg "$sock" "$pid" \
    origin="$origin" cow="$cow" writeback=on
wbio held-reads "$sock" "$origin" "$pristine" "$model" "$pause" "$seed" || true
export_equals "$(uri "$sock" snapshot)" "$pristine" "held reads: snapshot == pristine"
stop_nbdkit "$pid"
files_equal "$origin" "$model" "held reads: origin file after the stop"

# ---- 2. backpressure --------------------------------------------------
info "=== 2. backpressure: writeback-max=64K, the committer paused"
fresh
touch "$pause"
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" start_snapfg "$sock" "$pid" \
    origin="$origin" cow="$cow" control="$ctlsock" writeback-max=64K
"$PY" "$WBIO" backpressure "$sock" "$origin" "$model" "$pause" 64 \
    >"$tmpdir/bp.out" 2>&1 &
writer=$!
waiting() { [ "$(stat_field writeback_waiting)" -ge 1 ]; }
wait_until 60 waiting && info "ok: a writer waits for room" ||
    check_fail "no writer waiting for room with writeback-max=64K and 64 writes"
held=$(stat_field writeback_held_bytes)
[ "$held" -le 65536 ] && info "ok: $held bytes held, within writeback-max" ||
    check_fail "$held bytes held, over writeback-max=64K"
rm -f "$pause"
st=0; wait "$writer" || st=$?
cp "$tmpdir/bp.out" "$tmpdir/wbio.out"; report
[ "$st" = 0 ] || check_fail "the backpressure writer failed (status $st)"
[ "$(stat_field writeback_room_waits)" -ge 1 ] ||
    check_fail "stats: writeback_room_waits did not count the wait"
export_equals "$(uri "$sock" snapshot)" "$pristine" "backpressure: snapshot == pristine"
stop_nbdkit "$pid"
files_equal "$origin" "$model" "backpressure: origin file"

# ---- 3. a clean stop applies what is held -----------------------------
info "=== 2b. no memory to hold a write: it is written as with writeback=off"
for case in FIRST OVER; do
    fresh
    touch "$pause"
    n=$([ "$case" = FIRST ] && echo 1 || echo 3)
    SNAPFG_TEST_FAIL_AT=held-data:$n SNAPFG_TEST_WRITEBACK_PAUSE="$pause" \
        start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
    wbio not-held "$sock" "$origin" "$pristine" "$model" "$pause" "$case" ||
        check_fail "$case: a write that could not be held failed"
    if grep -q "could not be held in memory" "$pid.log"; then
        info "ok: $case: the log says the write could not be held: $(grep -m1 'could not be held' "$pid.log" | cut -c1-160)"
    else
        check_fail "$case: nothing in the log says a write could not be held"
    fi
    stop_nbdkit "$pid"
    files_equal "$origin" "$model" "$case: after the stop the origin file holds every write"
done

info "=== 3. a clean stop applies and syncs held writes"
fresh
touch "$pause"
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" start_snapfg "$sock" "$pid" \
    origin="$origin" cow="$cow"
wbio fill "$sock" "$model" 200 "$seed" || true
cmp -s "$origin" "$pristine" && info "ok: nothing on the origin file while held" ||
    check_fail "the origin file changed while the committer was paused"
stop_nbdkit "$pid"
rm -f "$pause"
files_equal "$origin" "$model" "after a clean stop the origin file holds every write"
start_snapfg "$sock" "$pid" origin="$origin" cow="$cow"
export_equals "$(uri "$sock" snapshot)" "$pristine" "clean stop: snapshot == pristine"
stop_nbdkit "$pid"

# ---- 3b. the committer's copies past the page cache ---------------------
# has_direct_fd PID FILE: does the server have FILE open with O_DIRECT?
has_direct_fd() {
    local fdi flags want
    want=$(realpath "$2")
    for fdi in /proc/"$1"/fdinfo/*; do
        [ "$(readlink "/proc/$1/fd/${fdi##*/}" 2>/dev/null)" = "$want" ] || continue
        flags=$(awk '/^flags:/ { print $2 }' "$fdi")
        (( 8#$flags & 8#40000 )) && return 0
    done
    return 1
}
shm_dir=
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    shm_dir=$(mktemp -d /dev/shm/snapfg-test-writeback.XXXXXX)
fi
for cow_dir in "$tmpdir" $shm_dir; do
    info "=== 3b. copies into a COW file in $(df --output=fstype "$cow_dir" | tail -1)"
    fresh
    dcow="$cow_dir/direct.cow"
    rm -f "$dcow"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$dcow"
    spid=$(cat "$pid")
    wbio fill "$sock" "$model" 300 "$seed" || true
    "$PY" -c 'import nbd, sys; h = nbd.NBD(); h.connect_unix(sys.argv[1]); h.flush(); h.shutdown()' "$sock" ||
        check_fail "a flush failed"
    if dd if=/dev/zero of="$cow_dir/probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null; then
        has_direct_fd "$spid" "$dcow" && info "ok: the COW file is written with O_DIRECT" ||
            check_fail "no O_DIRECT descriptor of the COW file on a file system that takes it"
    else
        has_direct_fd "$spid" "$dcow" && check_fail "an O_DIRECT descriptor on a file system without it" ||
            info "ok: no O_DIRECT here: buffered copies"
    fi
    rm -f "$cow_dir/probe"
    export_equals "$(uri "$sock" snapshot)" "$pristine" "3b: snapshot == pristine"
    export_equals "$(uri "$sock" origin)" "$model" "3b: origin export == model"
    stop_nbdkit "$pid"
    files_equal "$origin" "$model" "3b: origin file after the stop"
    start_snapfg "$sock" "$pid" origin="$origin" cow="$dcow"
    export_equals "$(uri "$sock" snapshot)" "$pristine" "3b: restarted: snapshot == pristine"
    stop_nbdkit "$pid"
    rm -f "$dcow"
done
[ -z "$shm_dir" ] || rm -rf "$shm_dir"

# ---- 4 and 5: failures after the acknowledgement ----------------------
# backend SOCK PIDFILE ARGS...: a plain nbdkit (stopped with stop_nbdkit).
backend() {
    local s=$1 p=$2
    shift 2
    rm -f "$s" "$p"
    nbdkit -f --exit-with-parent -U "$s" -P "$p" "$@" 2>"$p.log" &
    _nbdkit_pids[$p]=$!
    _nbdkit_logs[$p]="$p.log"
    for _ in $(seq 300); do [ -S "$s" ] && [ -s "$p" ] && return 0; sleep 0.1; done
    fail "nbdkit $* did not start"
}

info "=== 4. a held origin write fails: the next flush on every connection fails"
fresh
osock="$tmpdir/o.sock"; opid="$tmpdir/o.pid"; trigger="$tmpdir/fail-writes"
rm -f "$trigger"
backend "$osock" "$opid" --filter=error file "$origin" \
    error-pwrite=EIO error-pwrite-rate=100% error-pwrite-file="$trigger"
touch "$pause"
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" start_snapfg "$sock" "$pid" \
    origin="$(uri "$osock")" cow="$cow" control="$ctlsock"
wbio write "$sock" 0x200000 8192 0x77 || check_fail "the first write failed"
touch "$trigger"
wbio flush-fails "$sock" "$pause" || true
errs=$(stat_field writeback_origin_errors)
[ "$errs" -ge 1 ] && info "ok: stats: $errs origin write(s) failed" ||
    check_fail "stats: writeback_origin_errors is $errs"
grep -q "origin=.*write of 8192 bytes at 2097152 failed" "$pid.log" &&
    info "ok: the failed origin write is logged" ||
    check_fail "the failed origin write is not in the log"
rm -f "$trigger"
export_equals "$(uri "$sock" snapshot)" "$pristine" "origin write failed: snapshot still valid and pristine"
stop_nbdkit "$pid"
stop_nbdkit "$opid"

info "=== 4b. the committer's copy cannot read the origin"
fresh
trigger="$tmpdir/fail-reads"
rm -f "$trigger"
backend "$osock" "$opid" --filter=error file "$origin" \
    error-pread=EIO error-pread-rate=100% error-pread-file="$trigger"
touch "$pause"
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" start_snapfg "$sock" "$pid" \
    origin="$(uri "$osock")" cow="$cow" control="$ctlsock"
touch "$trigger"
wbio copy-read-fails "$sock" "$pristine" "$pause" "$trigger" || true
grep -q "origin=.*read of chunks\? 51[12].* for a copy-out failed" "$pid.log" &&
    info "ok: the failed read is logged" ||
    check_fail "the copy's failed origin read is not in the log"
grep -q "write of 8192 bytes at 2097152 was acknowledged but is not applied" \
    "$pid.log" && info "ok: the dropped write is logged" ||
    check_fail "the dropped write is not in the log"
! grep -q "is now Invalid" "$pid.log" ||
    check_fail "the snapshot became Invalid on an origin read error"
errs=$(stat_field writeback_origin_errors)
[ "$errs" -ge 1 ] && info "ok: stats: $errs origin error(s)" ||
    check_fail "stats: writeback_origin_errors is $errs"
model_write 0x200000 8192 0x77
export_equals "$(uri "$sock" snapshot)" "$pristine" "origin read failed: snapshot still valid and pristine"
export_equals "$(uri "$sock" origin)" "$model" "origin read failed: origin holds only the write made again"
stop_nbdkit "$pid"
stop_nbdkit "$opid"
files_equal "$origin" "$model" "origin read failed: the origin file"

info "=== 5. a held write's commit fails: the snapshot becomes Invalid"
fresh
csock="$tmpdir/c.sock"; cpid="$tmpdir/c.pid"; trigger="$tmpdir/fail-cow"
rm -f "$trigger"
# The paused committer copies the chunk once a second write waits for it
# (its copy-out is done; both origin writes stay held); the commit's
# metadata write comes after, once it is let go, and fails.
backend "$csock" "$cpid" --filter=error memory 32M \
    error-pwrite=EIO error-pwrite-rate=100% error-pwrite-file="$trigger"
touch "$pause"
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" start_snapfg "$sock" "$pid" \
    origin="$origin" cow="$(uri "$csock")" control="$ctlsock"
wbio write "$sock" 0x300000 4096 0x66 || check_fail "the first write failed"
wbio write "$sock" 0x300000 4096 0x66 || check_fail "the second write failed"
snapshot_copied() {
    "$SNAPFGCTL" --socket "$ctlsock" stats --json >"$tmpdir/stats.json" &&
    [ "$(jq_py "$tmpdir/stats.json" \
        "[x for x in d['exports'] if x['export'] == 'snapshot'][0]['copy_outs']")" -ge 1 ]
}
wait_until 30 snapshot_copied ||
    check_fail "the paused committer did not copy the chunk out"
model_write 0x300000 4096 0x66
touch "$trigger"
rm -f "$pause"
"$PY" -m nbd -u "$(uri "$sock" origin)" -c 'h.flush()' ||
    check_fail "the origin flush failed (only the snapshot is lost)"
"$PY" -m nbd -u "$(uri "$sock" snapshot)" -c 'h.pread(4096, 0)' 2>/dev/null &&
    check_fail "the snapshot still reads after its commit failed" ||
    info "ok: the snapshot is Invalid after its commit failed"
grep -q "is now Invalid: committing an exception failed" "$pid.log" &&
    info "ok: the Invalid snapshot is logged" ||
    check_fail "no 'committing an exception failed' in the log"
rm -f "$trigger"
export_equals "$(uri "$sock" origin)" "$model" "commit failed: the origin write went ahead"
stop_nbdkit "$pid"
stop_nbdkit "$cpid"

# ---- 6. writeback=off -------------------------------------------------
info "=== 6. writeback=off: acknowledged writes are on the file at once"
fresh
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" start_snapfg "$sock" "$pid" \
    origin="$origin" cow="$cow" control="$ctlsock" writeback=off
touch "$pause"                 # would hold them, were write-back on
wbio fill "$sock" "$model" 50 "$seed" || true
files_equal "$origin" "$model" "writeback=off: the file holds every acknowledged write"
[ "$(stat_field writeback)" = false ] || check_fail "stats: writeback is not off"
[ "$(stat_field writeback_commit_rounds)" = 0 ] || check_fail "stats: commit rounds with writeback=off"
export_equals "$(uri "$sock" snapshot)" "$pristine" "writeback=off: snapshot == pristine"
stop_nbdkit "$pid"
rm -f "$pause"

# ---- 7. stores whose commit does not wait ------------------------------
for store_args in "store=transient" "store=persistent durability=flush"; do
    info "=== 7. writeback=on, $store_args: first writes are not held"
    fresh
    # shellcheck disable=SC2086
    SNAPFG_TEST_WRITEBACK_PAUSE="$pause" start_snapfg "$sock" "$pid" \
        origin="$origin" cow="$cow" control="$ctlsock" writeback=on $store_args
    touch "$pause"             # would hold them, were they held
    wbio fill "$sock" "$model" 50 "$seed" || true
    files_equal "$origin" "$model" "$store_args: the file holds every acknowledged write"
    [ "$(stat_field writeback)" = true ] || check_fail "stats: writeback is not on"
    [ "$(stat_field writeback_held_bytes)" = 0 ] ||
        check_fail "$store_args: bytes held for a store that commits without a sync"
    export_equals "$(uri "$sock" snapshot)" "$pristine" "$store_args: snapshot == pristine"
    stop_nbdkit "$pid"
    rm -f "$pause"
done

finish
