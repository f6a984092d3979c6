#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Two flushes in flight on one connection, both sent after a held write
# was acknowledged, and the held write then fails on its way to the
# origin (docs/design.md sections 5 and 6): BOTH flushes fail with EIO.
# Neither was told of the failure when it was sent, so a success would
# say that the lost write is durable.  (Counting the failure as reported
# by whichever flush looked first let the other one succeed: the power
# cut test lost writes a completed flush covered, found with two flushes
# waiting for one commit round when the disks went.)  Once both have
# failed, the connection has been told: its next flush succeeds, and so
# does a flush of a connection opened after that.
#
# Deterministic: the committer is paused (SNAPFG_TEST_WRITEBACK_PAUSE)
# while the write is held and both flushes wait for it, and the origin
# write of the first held write fails (SNAPFG_TEST_FAIL_AT=held-apply).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
require_snapfg

test_files $((4 * 1024 * 1024))
pause="$tmpdir/pause"
touch "$pause"
SNAPFG_TEST_WRITEBACK_PAUSE="$pause" SNAPFG_TEST_FAIL_AT=held-apply:1 \
    start_snapfg "$sock" "$pid" origin="$origin" cow="$cow" writeback=on

if "$PY" - "$(uri "$sock" origin)" "$pause" <<'EOF'
import errno, os, sys, time
import nbd

uri, pause = sys.argv[1:]
bad = 0


def say(msg):
    print("test-writeback-flush-errors: " + msg, file=sys.stderr)


def result(h, cookie):
    """None while in flight, else "ok" or the errno's name."""
    try:
        if not h.aio_command_completed(cookie):
            return None
        return "ok"
    except nbd.Error as e:
        return errno.errorcode.get(e.errno, str(e.errno))


h = nbd.NBD()
h.connect_uri(uri)
# A first write: held (its chunk's copy-out waits for the paused
# committer) and acknowledged.
h.pwrite(b"\x5a" * 4096, 0)
flushes = [h.aio_flush(), h.aio_flush()]
# Both wait for the held write: the committer is paused.
deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    h.poll(100)
    early = [r for r in (result(h, c) for c in flushes) if r is not None]
    if early:
        say("FAIL: a flush completed while its held write was not applied: %s"
            % early)
        sys.exit(1)
os.unlink(pause)
got = [None, None]
deadline = time.monotonic() + 60
while None in got and time.monotonic() < deadline:
    h.poll(100)
    got = [g if g is not None else result(h, c) for g, c in zip(got, flushes)]
if got != ["EIO", "EIO"]:
    say("FAIL: the two flushes covering the failed held write: %s, want "
        "EIO for both" % got)
    bad += 1
else:
    say("ok: both flushes in flight when the held write failed got EIO")
# Told now: the next flush on this connection, and one on a new
# connection, succeed.
for what, hh in (("this connection", h), ("a new connection", None)):
    if hh is None:
        hh = nbd.NBD()
        hh.connect_uri(uri)
    try:
        hh.flush()
        say("ok: the next flush on %s succeeds (reported)" % what)
    except nbd.Error as e:
        say("FAIL: the next flush on %s: %s, want success" % (what, e))
        bad += 1
    hh.shutdown()
sys.exit(1 if bad else 0)
EOF
then
    info "ok: the flushes report the failed held write"
else
    check_fail "the flushes in flight over a failed held write"
fi
grep -q 'failed: Input/output error (test hook)' "$pid.log" &&
    info "ok: the held write's failure is logged" ||
    check_fail "the test hook did not fail the held write (was it held?)"

stop_nbdkit "$pid"
finish
