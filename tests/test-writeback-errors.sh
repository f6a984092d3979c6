#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A held write that fails after its acknowledgement when the writer has
# gone (issue 29): the origin's file system is full, nbdcopy (which does
# not flush unless told to) has written and disconnected, the failure is
# in the log only.  Like the kernel's errseq for write-back errors, the
# next flush of ANY connection reports it, also of one opened after the
# failure; once reported it is seen, and a connection opened after that
# flushes successfully.  stats counts the failures nobody has heard of
# (writeback_errors_unseen, also in the Prometheus output).
#
# The origin: a sparse file on a 4 MiB tmpfs (needs root to mount), with
# a persistent snapshot on the test directory's file system; 16 MiB of
# first writes, every one held, most of which the origin cannot take.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
requires nbdkit truncate mount umount

test_files
fsdir="$tmpdir/small-fs"
mkdir "$fsdir"
mount -t tmpfs -o size=4M,mode=0700 snapfg-test-full "$fsdir" 2>"$tmpdir/mount.err" ||
    skip "cannot mount a 4 MiB tmpfs for a full origin file system (root needed): $(cat "$tmpdir/mount.err")"
on_exit 'umount -l "$fsdir"'
origin="$fsdir/origin.img"
truncate -s 32M "$origin"
src="$tmpdir/src.img"
make_random_image "$src" $((16 * 1024 * 1024))

start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" control="$ctlsock" \
    writeback=on

# stat_field KEY: the origin export's KEY in snapfgctl stats --json.
stat_field() {
    "$SNAPFGCTL" --socket "$ctlsock" stats --json >"$tmpdir/stats.json" ||
        return 1
    jq_py "$tmpdir/stats.json" \
        "[x for x in d['exports'] if x['export'] == 'origin'][0]['$1']"
}

# flush_result: a new connection's flush: "ok" or the errno's name.
flush_result() {
    "$PY" - "$(uri "$sock" origin)" <<'PYEOF'
import errno, nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
try:
    h.flush()
    print("ok")
except nbd.Error as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
h.shutdown()
PYEOF
}

if nbdcopy -- "$src" "$(uri "$sock" origin)" 2>"$tmpdir/nbdcopy.err"; then
    info "ok: nbdcopy (no flush) exits 0: every write was acknowledged"
else
    cat "$tmpdir/nbdcopy.err" >&2
    check_fail "nbdcopy failed: its writes were not all held"
fi

# The committer applies what nbdcopy left; the origin refuses most.
nothing_held() { [ "$(stat_field writeback_held_writes)" = 0 ]; }
wait_until 60 nothing_held ||
    check_fail "write-back still holds writes 60 s after nbdcopy"
errors=$(stat_field writeback_origin_errors)
[ "$errors" -gt 0 ] && info "ok: $errors held writes failed on the full origin" ||
    fail "no held write failed: the origin's file system was not full"
grep -q 'No space left on device' "$pid.log" &&
    info "ok: the failure is logged" || check_fail "the failure is not logged"
unseen=$(stat_field writeback_errors_unseen || echo missing)
[ "$unseen" = "$errors" ] && info "ok: stats: $unseen errors unseen" ||
    check_fail "stats: writeback_errors_unseen is $unseen, want $errors"
"$SNAPFGCTL" --socket "$ctlsock" stats --prometheus >"$tmpdir/prom.txt"
grep -q "^snapfg_writeback_errors_unseen{.*} $errors\$" "$tmpdir/prom.txt" &&
    info "ok: the Prometheus output has snapfg_writeback_errors_unseen" ||
    check_fail "the Prometheus output has no snapfg_writeback_errors_unseen $errors: $(grep errors "$tmpdir/prom.txt")"

# A connection opened after the failure, whose writer has gone.
r=$(flush_result)
[ "$r" = EIO ] && info "ok: a new connection's flush fails with EIO" ||
    check_fail "a new connection's flush after an unseen write-back error: $r, want EIO"
unseen=$(stat_field writeback_errors_unseen || echo missing)
[ "$unseen" = 0 ] && info "ok: stats: seen now" ||
    check_fail "stats: writeback_errors_unseen is $unseen after the flush reported it"
r=$(flush_result)
[ "$r" = ok ] && info "ok: the next connection's flush succeeds (seen)" ||
    check_fail "the flush of a connection opened after the error was reported: $r, want ok"

stop_nbdkit "$pid"
finish
