# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The client side of the power-cut rounds (tests/test-powercut.sh).
#
#   load URI --seed S --log LOG [--in-flight K] [--max-len L]
#        [--flush-every F] [--trigger FILE --trigger-after N] [--max-writes M]
#        [--final-flush]
#       Random writes and zeroes (multiples of 512 bytes) to the origin
#       export URI, K in flight over C connections (--connections C,
#       default 2; libnbd aio), one in ten with FUA (--fua P), a flush
#       issued every F completed writes on any connection, also in
#       flight.  Requests in flight never overlap, so the writes to each
#       sector have one order.  After N completed writes it creates FILE (the harness
#       cuts the power), then goes on until a request fails or M writes
#       are done, and waits for every reply (at most --timeout seconds
#       in all).  --final-flush: then a flush, which must succeed.
#       LOG records each write (offset, data, acknowledged or not) and
#       which writes are durable: those acknowledged with FUA or before a
#       flush that completed was sent.
#   check LOG --base BASE (--image FILE | --uri URI)
#       The origin after the restart, per 512-byte sector: a sector whose
#       last durable write is W holds W or a later one; any other
#       written sector holds its contents before its first write that is
#       not durable, or one of the writes made since; a sector never
#       written holds BASE.  Prints what it found.
#
# Exit status 1 and a message naming the first wrong sectors on failure.

import argparse
import os
import pickle
import random
import select
import sys
import time

import nbd

from snapfg_test import connect, close, log

SECTOR = 512


def wait(hs):
    """Wait up to a second for any of the connections hs to be ready,
    and let libnbd go on with it.  False if none was."""
    rd, wr = {}, {}
    for h in hs:
        d = h.aio_get_direction()
        if d & nbd.AIO_DIRECTION_READ:
            rd[h.aio_get_fd()] = h
        if d & nbd.AIO_DIRECTION_WRITE:
            wr[h.aio_get_fd()] = h
    r, w, _ = select.select(list(rd), list(wr), [], 1.0)
    for fd in r:
        rd[fd].aio_notify_read()
    for fd in w:
        wr[fd].aio_notify_write()
    return bool(r or w)


def cmd_load(a):
    rng = random.Random(a.seed)
    hs = [connect(a.uri) for _ in range(a.connections)]
    size = hs[0].get_size()
    writes = []           # [offset, data (None: zeroes), length, acked]
    # (connection, cookie) -> ("w", index) or ("f", issue_event)
    inflight = {}
    ranges = {}           # (connection, cookie) -> (start, end) of a write
    flushed_upto = []     # completed flushes: the event count at issue
    acked_at = []         # per write: the event count at its ack, or None
    is_fua = []           # per write: sent with FUA
    event = 0
    completed = 0
    since_flush = 0
    triggered = a.trigger is None
    stop = False
    errors = 0
    first_error = None
    deadline = time.monotonic() + a.timeout

    def overlaps(s, e):
        return any(s < re and rs < e for rs, re in ranges.values())

    while True:
        while not stop and len(inflight) < a.in_flight:
            # Any connection: a flush covers the writes of every one.
            c = rng.randrange(len(hs))
            h = hs[c]
            if since_flush >= a.flush_every:
                since_flush = 0
                cookie = h.aio_flush()
                inflight[c, cookie] = ("f", event)
                event += 1
                continue
            for _ in range(20):
                length = rng.randrange(1, a.max_len // SECTOR + 1) * SECTOR
                off = rng.randrange(0, (size - length) // SECTOR + 1) * SECTOR
                if not overlaps(off, off + length):
                    break
            else:
                break                   # wait for a reply
            i = len(writes)
            fua = rng.random() < a.fua
            flags = nbd.CMD_FLAG_FUA if fua else 0
            if rng.random() < 0.1:
                cookie = h.aio_zero(length, off, flags=flags)
                writes.append([off, None, length, False])
            else:
                data = rng.randbytes(length)
                buf = nbd.Buffer.from_bytearray(bytearray(data))
                cookie = h.aio_pwrite(buf, off, flags=flags)
                writes.append([off, data, length, False])
            acked_at.append(None)
            is_fua.append(fua)
            inflight[c, cookie] = ("w", i)
            ranges[c, cookie] = (off, off + length)
            event += 1
            if len(writes) >= a.max_writes:
                stop = True
        if not inflight:
            break
        if not wait(hs) and time.monotonic() > deadline:
            # snapfg is killed next; the dropped connection is expected.
            sys.exit("%d requests in flight got no reply within %d s" %
                     (len(inflight), a.timeout))
        for key in list(inflight):
            c, cookie = key
            try:
                if not hs[c].aio_command_completed(cookie):
                    continue
                ok = True
            except nbd.Error as e:
                ok = False
                errors += 1
                if first_error is None:
                    first_error = e.string
            kind, x = inflight.pop(key)
            ranges.pop(key, None)
            if kind == "w":
                if ok:
                    writes[x][3] = True
                    acked_at[x] = event
                    event += 1
                    completed += 1
                    since_flush += 1
            elif ok:
                flushed_upto.append(x)
            if not ok and triggered:
                stop = True
        if not triggered and completed >= a.trigger_after:
            open(a.trigger, "w").close()
            triggered = True
            # Keep writing a while: requests meet the cut in flight.
            stop_at = len(writes) + a.after_trigger
            a.max_writes = min(a.max_writes, stop_at)
    if a.final_flush:
        hs[0].flush()
        flushed_upto.append(event)
    for h in hs:
        close(h)

    # Which writes are durable: acknowledged before the latest completed
    # flush was sent, or acknowledged with FUA.
    last_flush = max(flushed_upto) if flushed_upto else -1
    covered = [t is not None and (t < last_flush or f)
               for t, f in zip(acked_at, is_fua)]
    with open(a.log, "wb") as f:
        pickle.dump({"size": size, "writes": writes, "covered": covered}, f)
    log("%d writes (%d acknowledged, %d with FUA, %d durable by FUA or a "
        "completed flush), %d flushes completed, %d requests failed%s" %
        (len(writes), sum(w[3] for w in writes), sum(is_fua), sum(covered),
         len(flushed_upto), errors,
         ": " + first_error if first_error else ""))
    if not triggered:
        sys.exit("the trigger was never pulled (%d writes completed)" % completed)


def read_image(a, size):
    if a.image:
        return open(a.image, "rb").read()
    h = connect(a.uri)
    out = bytearray()
    step = 1 << 20
    for off in range(0, size, step):
        out += h.pread(min(step, size - off), off)
    close(h)
    return bytes(out)


def cmd_check(a):
    with open(a.log, "rb") as f:
        rec = pickle.load(f)
    size, writes, covered = rec["size"], rec["writes"], rec["covered"]
    base = open(a.base, "rb").read()
    if len(base) != size:
        sys.exit("base %s has %d bytes, the export %d" % (a.base, len(base), size))
    got = read_image(a, size)
    if len(got) != size:
        sys.exit("read %d bytes, expected %d" % (len(got), size))

    # Per sector, the versions it may hold: its contents before the
    # first write no completed flush covers, then every later write.
    nsect = size // SECTOR
    allowed = [None] * nsect          # None: only base
    older = {}                        # sector -> versions a durable write replaced
    zero = bytes(SECTOR)
    for i, (off, data, length, acked) in enumerate(writes):
        for k in range(length // SECTOR):
            s = off // SECTOR + k
            v = zero if data is None else data[k * SECTOR:(k + 1) * SECTOR]
            if covered[i]:
                older.setdefault(s, []).extend(
                    allowed[s] or [base[s * SECTOR:(s + 1) * SECTOR]])
                allowed[s] = [v]      # durable: earlier versions are gone
            elif allowed[s] is None:
                allowed[s] = [base[s * SECTOR:(s + 1) * SECTOR], v]
            else:
                allowed[s].append(v)

    bad_flushed, bad_other = [], []
    n_new = n_old = 0
    for s in range(nsect):
        g = got[s * SECTOR:(s + 1) * SECTOR]
        al = allowed[s]
        if al is None:
            if g != base[s * SECTOR:(s + 1) * SECTOR]:
                bad_other.append(s)
            continue
        if g in al:
            if len(al) > 1:
                if g == al[-1]:
                    n_new += 1
                elif g == al[0]:
                    n_old += 1
            continue
        # Older than its last durable write, or never written at all.
        (bad_flushed if g in older.get(s, []) or len(al) == 1
         else bad_other).append(s)
    if bad_flushed or bad_other:
        msg = []
        if bad_flushed:
            msg.append("%d sectors lost a write acknowledged with FUA or "
                       "covered by a completed flush (first sectors %s)"
                       % (len(bad_flushed), bad_flushed[:8]))
        if bad_other:
            msg.append("%d sectors hold neither their old contents nor any "
                       "write made to them (first sectors %s)" %
                       (len(bad_other), bad_other[:8]))
        sys.exit("; ".join(msg))
    log("ok: every flushed write is there; of the sectors with unflushed "
        "writes %d hold the newest, %d the old contents, %d an earlier write"
        % (n_new, n_old,
           sum(1 for al in allowed if al and len(al) > 1) - n_new - n_old))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("load")
    s.add_argument("uri")
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--log", required=True)
    s.add_argument("--in-flight", type=int, default=8)
    s.add_argument("--connections", type=int, default=2)
    s.add_argument("--max-len", type=int, default=65536)
    s.add_argument("--flush-every", type=int, default=16)
    s.add_argument("--fua", type=float, default=0.1)
    s.add_argument("--trigger")
    s.add_argument("--trigger-after", type=int, default=100)
    s.add_argument("--after-trigger", type=int, default=64)
    s.add_argument("--max-writes", type=int, default=100000)
    s.add_argument("--final-flush", action="store_true")
    s.add_argument("--timeout", type=int, default=60)
    s.set_defaults(fn=cmd_load)
    s = sub.add_parser("check")
    s.add_argument("log")
    s.add_argument("--base", required=True)
    s.add_argument("--image")
    s.add_argument("--uri")
    s.set_defaults(fn=cmd_check)
    a = p.parse_args()
    a.fn(a)


main()
