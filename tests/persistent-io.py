#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# NBD client helper for the persistent-store tests (test-persistent-*.sh).
# Run it with /usr/bin/python3 (the interpreter that has the nbd module).
# What it shares with the other helpers is in snapfg_test.py.
#
#   write-random URI --seed S --count N [--max-len L] [--align A]
#                [--size BYTES] [--model FILE] [--chunk-size C]
#                [--chunks-out FILE] [--region OFF:LEN]
#       N writes of random data at random aligned offsets.  Each write is
#       also applied to the model file (if given), and the chunks it
#       touches are appended to --chunks-out, one number a line.
#
#   write-chunks URI --chunk-size C --chunks A,B,C-D,... [--seed S]
#                [--piece OFF:LEN] [--model FILE] [--chunks-out FILE]
#       One write per listed chunk, in order: the whole chunk, or the
#       piece OFF:LEN of it.  Stops at the first error, printing
#       "error index I chunk C errno NAME" and exiting 3; on success
#       prints "ok N".
#
#   writer-loop URI --seed S [--max-len L] [--align A] [--in-flight K]
#               [--region OFF:LEN] [--pause-ms MS] [--ready-file F]
#       Random writes, K in flight, until the connection fails (then
#       exits 0: the server is expected to die under it).  --pause-ms
#       sleeps after each reply, to slow the writer down; F is created
#       after the first reply.
#
#   snap-writer URI --seed S --chunk-size C --chunks A-B [--piece OFF:LEN]
#               --log FILE
#       One write at a time, to the listed chunks in an order shuffled by
#       S, the data a function of (S, chunk); after each reply the chunk's
#       number is appended to FILE (flushed).  Runs until the list is done
#       or the connection fails.
#
#   snap-model MODEL IMAGE --seed S --chunk-size C --chunks A-B
#              [--piece OFF:LEN] --log FILE
#       Apply the writes snap-writer logged to MODEL.  The write after the
#       last logged one may or may not have happened: if IMAGE (what the
#       snapshot reads now) holds it, apply it too.  Prints what it did.
#
#   read URI OFFSET LEN
#       Read; print "ok" or "errno NAME" (exit 0 either way, 2 on a
#       connection failure).
#
#   pwrite URI OFFSET LEN --seed S
#       One write of random data; print "ok" or "errno NAME".
#
#   drive-until-death URI --chunk-size C [--first A] [--max N]
#                     [--write-size W]
#       Whole-chunk writes to chunks A, A+1, ... until the server dies;
#       prints "completed K" (the writes that got a reply).  With W (a
#       multiple of C), writes of W bytes at A*W, (A+1)*W, ... instead.
#
#   seq-writer URI --seed S --write-size W [--in-flight K]
#              [--region OFF:LEN] --log FILE [--ready-file F]
#       Writes of W bytes one after the other over the region, K in
#       flight, the data a function of (S, offset); each acknowledged
#       write's offset is appended to FILE at once.  Stops at the end of
#       the region or when the connection fails (exit 0).
#
#   check-acked IMAGE --write-size W --seed S --log FILE
#               [--seed S2 --log FILE2 ...]
#       Every write seq-writer logged is in IMAGE; one line per writer
#       (a --seed and its --log, in the order given), "writer I: ok: ..."
#       or "writer I: MISSING: ..." naming the first one missing; exits
#       1 if any is.  Several writers in one run: one Python start, not
#       one per writer.

import argparse
import random
import sys
import time

import nbd

from snapfg_test import (log, connect, close, errno_name, parse_region,
                         parse_chunks, touched, random_request,
                         add_read_command)


def apply_model(model, offset, data):
    if model is not None:
        model.seek(offset)
        model.write(data)


def cmd_write_random(a):
    rng = random.Random(a.seed)
    h = connect(a.uri)
    size = h.get_size()
    roff, rlen = parse_region(a.region, size)
    model = open(a.model, "r+b") if a.model else None
    chunks = set()
    for _ in range(a.count):
        offset, length = random_request(rng, roff, rlen, a.max_len, a.align)
        data = rng.randbytes(length)
        h.pwrite(data, offset)
        apply_model(model, offset, data)
        chunks.update(touched(offset, length, a.chunk_size))
    h.flush()
    close(h)
    if model:
        model.close()
    if a.chunks_out:
        with open(a.chunks_out, "a") as f:
            for c in sorted(chunks):
                f.write("%d\n" % c)
    print("ok %d writes, %d chunks" % (a.count, len(chunks)))


def cmd_write_chunks(a):
    rng = random.Random(a.seed)
    h = connect(a.uri)
    model = open(a.model, "r+b") if a.model else None
    chunks = parse_chunks(a.chunks)
    done = []
    rc = 0
    for i, c in enumerate(chunks):
        if a.piece:
            poff, plen = (int(x, 0) for x in a.piece.split(":"))
        else:
            poff, plen = 0, a.chunk_size
        offset = c * a.chunk_size + poff
        data = rng.randbytes(plen)
        try:
            h.pwrite(data, offset)
        except nbd.Error as e:
            print("error index %d chunk %d errno %s" % (i, c, errno_name(e)))
            rc = 3
            break
        apply_model(model, offset, data)
        done.append(c)
    if rc == 0:
        h.flush()
    close(h)
    if model:
        model.close()
    if a.chunks_out:
        with open(a.chunks_out, "a") as f:
            for c in done:
                f.write("%d\n" % c)
    if rc == 0:
        print("ok %d" % len(done))
    sys.exit(rc)


def cmd_writer_loop(a):
    rng = random.Random(a.seed)
    n = 0
    try:
        h = connect(a.uri)
        roff, rlen = parse_region(a.region, h.get_size())
        inflight = {}
        while True:
            while h.aio_in_flight() < a.in_flight:
                offset, length = random_request(rng, roff, rlen, a.max_len,
                                                a.align)
                buf = nbd.Buffer.from_bytearray(bytearray(rng.randbytes(length)))
                cookie = h.aio_pwrite(buf, offset)
                inflight[cookie] = buf
            h.poll(-1)
            if a.pause_ms:
                time.sleep(a.pause_ms / 1000)
            for cookie in list(inflight):
                if h.aio_command_completed(cookie):
                    del inflight[cookie]
                    n += 1
                    if n == 1 and a.ready_file:
                        open(a.ready_file, "w").close()
    except nbd.Error as e:
        log("writer %d: stopped after %d writes: %s" % (a.seed, n, e.string),
            file=sys.stderr)
    sys.exit(0)


def seq_data(seed, offset, length):
    return random.Random(seed * 1000003 + offset).randbytes(length)


def cmd_seq_writer(a):
    # Sequential writes of --write-size over the region, --in-flight at a
    # time; every acknowledged write's offset goes to --log at once.  With
    # --flush-every N, a flush is sent (in flight with the writes) after
    # every N acknowledgements, and an offset goes to --log only once a
    # flush sent after its acknowledgement has completed: the log then
    # holds the flushed writes.
    n = 0
    log = open(a.log, "a", buffering=1)
    unflushed = []                  # acknowledged, no flush sent since
    try:
        h = connect(a.uri)
        roff, rlen = parse_region(a.region, h.get_size())
        offsets = iter(range(roff, roff + rlen - a.write_size + 1, a.write_size))
        inflight = {}
        more = True
        while more or inflight:
            while more and h.aio_in_flight() < a.in_flight:
                if a.flush_every and len(unflushed) >= a.flush_every:
                    cookie = h.aio_flush()
                    inflight[cookie] = (None, unflushed)
                    unflushed = []
                    continue
                offset = next(offsets, None)
                if offset is None:
                    more = False
                    break
                buf = nbd.Buffer.from_bytearray(
                    bytearray(seq_data(a.seed, offset, a.write_size)))
                cookie = h.aio_pwrite(buf, offset)
                inflight[cookie] = (buf, offset)
            if inflight:
                h.poll(-1)
            for cookie in list(inflight):
                if h.aio_command_completed(cookie):
                    buf, what = inflight.pop(cookie)
                    if buf is None:                 # a flush: what it covers
                        for offset in what:
                            log.write("%d\n" % offset)
                    elif a.flush_every:
                        unflushed.append(what)
                    else:
                        log.write("%d\n" % what)
                    n += 1
                    if n == 1 and a.ready_file:
                        open(a.ready_file, "w").close()
    except nbd.Error as e:
        print("seq-writer %d: stopped after %d writes: %s" % (a.seed, n, e.string),
              file=sys.stderr)
    sys.exit(0)


def cmd_check_acked(a):
    # Every write seq-writer logged as acknowledged is in the image.
    if len(a.seed) != len(a.log):
        sys.exit("check-acked: %d --seed but %d --log" % (len(a.seed), len(a.log)))
    img = open(a.image, "rb")
    rc = 0
    for i, (seed, log_file) in enumerate(zip(a.seed, a.log)):
        bad = []
        n = 0
        for line in open(log_file):
            offset = int(line)
            img.seek(offset)
            if img.read(a.write_size) != seq_data(seed, offset, a.write_size):
                bad.append(offset)
            n += 1
        if bad:
            print("writer %d: MISSING: %d of %d acknowledged writes are missing "
                  "from %s, first at offset %d" % (i, len(bad), n, a.image, bad[0]))
            rc = 1
        else:
            print("writer %d: ok: %d acknowledged writes of %d bytes present"
                  % (i, n, a.write_size))
    sys.exit(rc)


def snap_order(a):
    order = parse_chunks(a.chunks)
    random.Random(a.seed).shuffle(order)
    return order


def snap_piece(a):
    if a.piece:
        return tuple(int(x, 0) for x in a.piece.split(":"))
    return 0, a.chunk_size


def snap_data(a, chunk, length):
    return random.Random(a.seed * 1000003 + chunk).randbytes(length)


def cmd_snap_writer(a):
    poff, plen = snap_piece(a)
    n = 0
    try:
        h = connect(a.uri)
        with open(a.log, "a") as log:
            for c in snap_order(a):
                h.pwrite(snap_data(a, c, plen), c * a.chunk_size + poff)
                log.write("%d\n" % c)
                log.flush()
                n += 1
        close(h)
    except nbd.Error as e:
        log("snap-writer %d: stopped after %d writes: %s"
            % (a.seed, n, e.string), file=sys.stderr)


def cmd_snap_model(a):
    poff, plen = snap_piece(a)
    order = snap_order(a)
    try:
        logged = [int(l) for l in open(a.log) if l.strip()]
    except FileNotFoundError:
        logged = []
    if logged != order[:len(logged)]:
        sys.exit("snap-model: the log is not a prefix of the write order")
    with open(a.model, "r+b") as m:
        for c in logged:
            m.seek(c * a.chunk_size + poff)
            m.write(snap_data(a, c, plen))
        extra = ""
        if len(logged) < len(order):
            c = order[len(logged)]
            d = snap_data(a, c, plen)
            with open(a.image, "rb") as img:
                img.seek(c * a.chunk_size + poff)
                if img.read(plen) == d:
                    m.seek(c * a.chunk_size + poff)
                    m.write(d)
                    extra = " + the write in flight (chunk %d)" % c
    print("%d acknowledged snapshot writes%s" % (len(logged), extra))


def cmd_pwrite(a):
    rng = random.Random(a.seed)
    h = connect(a.uri)
    try:
        h.pwrite(rng.randbytes(a.length), a.offset)
        print("ok")
    except nbd.Error as e:
        print("errno %s" % errno_name(e))
    close(h)


def cmd_drive_until_death(a):
    rng = random.Random(a.first)
    h = connect(a.uri)
    done = 0
    size = a.write_size or a.chunk_size
    try:
        for c in range(a.first, a.first + a.max):
            h.pwrite(rng.randbytes(size), c * size)
            done += 1
        print("completed %d (server still alive)" % done)
        close(h)
        sys.exit(1)
    except nbd.Error:
        pass
    print("completed %d" % done)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("write-random")
    s.add_argument("uri")
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--max-len", type=int, default=65536)
    s.add_argument("--align", type=int, default=512)
    s.add_argument("--model")
    s.add_argument("--chunk-size", type=int, default=4096)
    s.add_argument("--chunks-out")
    s.add_argument("--region")
    s.set_defaults(fn=cmd_write_random)

    s = sub.add_parser("write-chunks")
    s.add_argument("uri")
    s.add_argument("--chunk-size", type=int, required=True)
    s.add_argument("--chunks", required=True)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--piece")
    s.add_argument("--model")
    s.add_argument("--chunks-out")
    s.set_defaults(fn=cmd_write_chunks)

    s = sub.add_parser("writer-loop")
    s.add_argument("uri")
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--max-len", type=int, default=131072)
    s.add_argument("--align", type=int, default=512)
    s.add_argument("--in-flight", type=int, default=4)
    s.add_argument("--region")
    s.add_argument("--pause-ms", type=float, default=0)
    s.add_argument("--ready-file")
    s.set_defaults(fn=cmd_writer_loop)

    for name, fn in (("snap-writer", cmd_snap_writer), ("snap-model", cmd_snap_model)):
        s = sub.add_parser(name)
        if name == "snap-writer":
            s.add_argument("uri")
        else:
            s.add_argument("model")
            s.add_argument("image")
        s.add_argument("--seed", type=int, required=True)
        s.add_argument("--chunk-size", type=int, required=True)
        s.add_argument("--chunks", required=True)
        s.add_argument("--piece")
        s.add_argument("--log", required=True)
        s.set_defaults(fn=fn)

    add_read_command(sub)

    s = sub.add_parser("pwrite")
    s.add_argument("uri")
    s.add_argument("offset", type=int)
    s.add_argument("length", type=int)
    s.add_argument("--seed", type=int, default=1)
    s.set_defaults(fn=cmd_pwrite)

    s = sub.add_parser("drive-until-death")
    s.add_argument("uri")
    s.add_argument("--chunk-size", type=int, required=True)
    s.add_argument("--first", type=int, default=0)
    s.add_argument("--max", type=int, default=100000)
    s.add_argument("--write-size", type=int, default=0)
    s.set_defaults(fn=cmd_drive_until_death)

    s = sub.add_parser("seq-writer")
    s.add_argument("uri")
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--write-size", type=int, required=True)
    s.add_argument("--in-flight", type=int, default=4)
    s.add_argument("--region")
    s.add_argument("--log", required=True)
    s.add_argument("--ready-file")
    s.add_argument("--flush-every", type=int, default=0)
    s.set_defaults(fn=cmd_seq_writer)

    s = sub.add_parser("check-acked")
    s.add_argument("image")
    s.add_argument("--seed", type=int, action="append", required=True)
    s.add_argument("--write-size", type=int, required=True)
    s.add_argument("--log", action="append", required=True)
    s.set_defaults(fn=cmd_check_acked)

    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
