#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
"""Writers and a checker for write-back's crash tests
(tests/test-writeback-crash.sh): every acknowledged write must survive a
crash of the server, with writeback=on as with writeback=off.

  held-io.py writer URI --seed N --log FILE [--region OFF:LEN]
             [--in-flight N] [--chunk-size B] [--ready-file F]
             [--max-chunks N] [--pause-ms MS]
      Writes, zeroes and trims of 1 to --max-chunks chunks (and a few
      shorter than a chunk), at random places of the region, over and over
      until the connection dies.  Up to --in-flight at a time, never two
      overlapping in flight, so that the order of any two requests over
      one sector is the order of their acknowledgements.  Each request is
      logged before it is sent ("I SEQ OP OFFSET LEN") and when it is
      acknowledged ("A SEQ").  The data of write SEQ follows from the
      seed: the checker regenerates it.

  held-io.py check IMAGE PRISTINE --seed N --log FILE [--seed N --log FILE]
             [--untouched]
      For every 512-byte sector the writers' logs touched, the image must
      hold what the last acknowledged request over it left there, or
      what a request sent after it and never acknowledged (in flight when
      the server died) would have.  With --untouched, every other sector
      must be PRISTINE's.  Prints how many requests were acknowledged and
      checked.
"""

import argparse
import random
import sys
import time

SECTOR = 512


def op_data(seed, seq, length):
    return random.Random(seed * 1000003 + seq).randbytes(length)


def cmd_writer(a):
    import nbd
    from snapfg_test import connect, parse_region

    rng = random.Random(a.seed)
    log = open(a.log, "a", buffering=1)
    seq = 0
    acked = 0
    try:
        h = connect(a.uri)
        roff, rlen = parse_region(a.region, h.get_size())
        cs = a.chunk_size
        inflight = {}              # cookie -> (seq, offset, length, buf)
        while True:
            while h.aio_in_flight() < a.in_flight:
                for _ in range(20):
                    if rng.random() < 0.15:
                        length = SECTOR * rng.randint(1, cs // SECTOR)
                    else:
                        length = cs * rng.randint(1, a.max_chunks)
                    length = min(length, rlen)
                    offset = roff + rng.randrange(0, (rlen - length) // SECTOR + 1) * SECTOR
                    if all(offset + length <= o or o + n <= offset
                           for (_, o, n, _) in inflight.values()):
                        break
                else:
                    break           # nowhere free now: wait for one
                seq += 1
                r = rng.random()
                op = "W" if r < 0.8 else ("Z" if r < 0.9 else "T")
                log.write("I %d %s %d %d\n" % (seq, op, offset, length))
                if op == "W":
                    buf = nbd.Buffer.from_bytearray(
                        bytearray(op_data(a.seed, seq, length)))
                    cookie = h.aio_pwrite(buf, offset)
                elif op == "Z":
                    buf = None
                    cookie = h.aio_zero(length, offset)
                else:
                    buf = None
                    cookie = h.aio_trim(length, offset)
                inflight[cookie] = (seq, offset, length, buf)
            h.poll(-1)
            for cookie in list(inflight):
                if h.aio_command_completed(cookie):
                    s = inflight.pop(cookie)[0]
                    log.write("A %d\n" % s)
                    acked += 1
                    if acked == 1 and a.ready_file:
                        open(a.ready_file, "w").close()
            if a.pause_ms:
                time.sleep(a.pause_ms / 1000)
    except nbd.Error as e:
        print("writer %d: stopped after %d acknowledged requests: %s"
              % (a.seed, acked, e.string), file=sys.stderr)
    sys.exit(0)


def read_log(path):
    ops = {}                        # seq -> (op, offset, length)
    order = []
    acked = set()
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] == "I" and len(f) == 5:
            s = int(f[1])
            ops[s] = (f[2], int(f[3]), int(f[4]))
            order.append(s)
        elif f[0] == "A" and len(f) == 2:
            acked.add(int(f[1]))
        # A torn last line (the writer was killed) is ignored.
    return ops, order, acked


def cmd_check(a):
    img = open(a.image, "rb").read()
    pristine = open(a.pristine, "rb").read()
    if len(a.seed) != len(a.log):
        sys.exit("check: give one --seed per --log")
    total_acked = 0
    bad = []
    touched = set()
    for seed, path in zip(a.seed, a.log):
        ops, order, acked = read_log(path)
        total_acked += len(acked)
        # Per sector: the candidates, oldest first.  Each request
        # replaces the candidates if it was acknowledged (nothing earlier
        # may show), or adds itself if not (it may or may not have
        # landed).
        cand = {}
        for s in order:
            op, offset, length = ops[s]
            for sec in range(offset // SECTOR, (offset + length) // SECTOR):
                entry = (s, op, offset)
                if s in acked:
                    cand[sec] = [entry]
                else:
                    cand.setdefault(sec, [None]).append(entry)
        touched.update(cand.keys())
        cache = {}                  # seq -> its data, made once
        for sec, cs in cand.items():
            got = img[sec * SECTOR:(sec + 1) * SECTOR]
            ok = False
            for c in cs:
                if c is None:
                    want = pristine[sec * SECTOR:(sec + 1) * SECTOR]
                else:
                    s, op, offset = c
                    if op == "W":
                        d = cache.get(s)
                        if d is None:
                            d = cache[s] = op_data(seed, s, ops[s][2])
                        at = sec * SECTOR - offset
                        want = d[at:at + SECTOR]
                    else:
                        want = bytes(SECTOR)
                if got == want:
                    ok = True
                    break
            if not ok:
                bad.append((seed, sec, cs[-1]))
    if a.untouched:
        n = min(len(img), len(pristine)) // SECTOR
        for sec in range(n):
            if sec not in touched and \
               img[sec * SECTOR:(sec + 1) * SECTOR] != pristine[sec * SECTOR:(sec + 1) * SECTOR]:
                sys.exit("sector %d (byte %d) changed although no writer "
                         "touched it" % (sec, sec * SECTOR))
    if bad:
        seed, sec, last = bad[0]
        sys.exit("%d sectors do not hold what the acknowledged requests left "
                 "(writer %d, first at sector %d, byte %d; last request over "
                 "it: %s)" % (len(bad), seed, sec, sec * SECTOR, last))
    print("%d acknowledged requests checked, every one present" % total_acked)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("writer")
    s.add_argument("uri")
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--log", required=True)
    s.add_argument("--region")
    s.add_argument("--in-flight", type=int, default=8)
    s.add_argument("--chunk-size", type=int, default=4096)
    s.add_argument("--max-chunks", type=int, default=16)
    s.add_argument("--ready-file")
    s.add_argument("--pause-ms", type=float, default=0)
    s.set_defaults(fn=cmd_writer)
    s = sub.add_parser("check")
    s.add_argument("image")
    s.add_argument("pristine")
    s.add_argument("--seed", type=int, action="append", default=[])
    s.add_argument("--log", action="append", default=[])
    s.add_argument("--untouched", action="store_true")
    s.set_defaults(fn=cmd_check)
    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
