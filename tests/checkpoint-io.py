#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# NBD client helper for the checkpoint tests (test-checkpoint*.sh).  Run
# it with /usr/bin/python3 (the interpreter that has the nbd module).
#
#   writer URI --size N --dir D --model FILE [--seed S] [--threads T]
#          [--max-len L] [--sleep SECONDS] [--no-trim]
#       T threads, each on its own connection and its own slice of the
#       disk, make random writes, zeroes and trims (512-byte aligned)
#       until D/stop exists.  Every operation is logged to D/ops.log
#       before it is sent ("S kind offset length") and after its reply
#       ("A kind offset length"; "E ..." if it failed, then the thread
#       stops).  The model (the origin as the writer believes it,
#       starting from FILE) is updated on each acknowledged operation.
#       Pausing: when D/pause-K exists (K = 1, 2, ...), every thread
#       finishes its operation in flight and waits; the writer then saves
#       the model to D/model-K.img, logs "P K", creates D/paused-K, and
#       resumes when D/resume-K exists.  At the end the model is saved to
#       D/model-end.img and "P end" is logged.
#
#   expect-ranges LOG --granularity G --size N [--from K] [--to K]
#                 [--acked | --sent]
#       The granules touched by the operations acknowledged (or sent)
#       between the pause markers K1 and K2 ("0": the start, "end": the
#       end), as byte ranges merged into extents, clipped to N, printed
#       as JSON [[offset, length], ...].
#
#   check-changed REPLY --expect RANGES [--superset-of A --subset-of B]
#                 [--old IMG --new IMG]
#       REPLY is the JSON reply of changed --since.  Its ranges must equal
#       the expected ranges (a JSON file from expect-ranges), or, with
#       --superset-of/--subset-of, lie between two such files.  With
#       --old/--new, every byte that differs between the two images must
#       lie in the reported ranges.  Prints what it checked; exit 1 on a
#       mismatch.

import argparse
import json
import os
import random
import sys
import threading
import time

import nbd

from snapfg_test import log


# --- writer ---------------------------------------------------------------

class Writer:
    def __init__(self, args):
        self.args = args
        self.model = bytearray(open(args.model, "rb").read())
        if len(self.model) != args.size:
            sys.exit("model %s has %d bytes, expected %d" %
                     (args.model, len(self.model), args.size))
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.logf = open(os.path.join(args.dir, "ops.log"), "a", buffering=1)
        self.pausing = False
        self.waiting = 0
        self.running = args.threads
        self.pause_no = 1
        self.failed = False

    def note(self, line):
        with self.lock:
            self.logf.write(line + "\n")

    def thread(self, tid):
        a = self.args
        rng = random.Random(a.seed * 1000 + tid)
        h = nbd.NBD()
        h.connect_uri(a.uri)
        slice_len = a.size // a.threads // 512 * 512
        base = tid * slice_len
        try:
            while True:
                with self.cond:
                    while self.pausing:
                        self.waiting += 1
                        self.cond.notify_all()
                        self.cond.wait()
                        self.waiting -= 1
                    if os.path.exists(os.path.join(a.dir, "stop")):
                        break
                n = rng.randint(1, a.max_len // 512) * 512
                n = min(n, slice_len)
                off = base + rng.randrange(0, (slice_len - n) // 512 + 1) * 512
                r = rng.random()
                if r < 0.8:
                    kind = "write"
                elif r < 0.9 or a.no_trim:
                    kind = "zero"
                else:
                    kind = "trim"
                data = rng.randbytes(n) if kind == "write" else bytes(n)
                self.note("S %s %d %d" % (kind, off, n))
                try:
                    if kind == "write":
                        h.pwrite(data, off)
                    elif kind == "zero":
                        h.zero(n, off)
                    else:
                        h.trim(n, off)
                except nbd.Error as e:
                    self.note("E %s %d %d %s" % (kind, off, n, e))
                    with self.cond:
                        self.failed = True
                    return
                with self.lock:
                    self.model[off:off + n] = data
                    self.logf.write("A %s %d %d\n" % (kind, off, n))
                if a.sleep:
                    time.sleep(a.sleep)
        finally:
            with self.cond:
                self.running -= 1
                self.cond.notify_all()
            try:
                h.shutdown()
            except nbd.Error:
                pass

    def save(self, tag):
        path = os.path.join(self.args.dir, "model-%s.img" % tag)
        with open(path + ".tmp", "wb") as f:
            f.write(self.model)
        os.rename(path + ".tmp", path)
        self.logf.write("P %s\n" % tag)

    def run(self):
        a = self.args
        threads = [threading.Thread(target=self.thread, args=(i,))
                   for i in range(a.threads)]
        for t in threads:
            t.start()
        d = a.dir
        while True:
            with self.cond:
                if self.running == 0:
                    break
            k = self.pause_no
            if os.path.exists(os.path.join(d, "pause-%d" % k)):
                with self.cond:
                    self.pausing = True
                    while self.waiting < self.running:
                        self.cond.wait()
                    self.save(str(k))
                open(os.path.join(d, "paused-%d" % k), "w").close()
                while not os.path.exists(os.path.join(d, "resume-%d" % k)):
                    if os.path.exists(os.path.join(d, "stop")):
                        break
                    time.sleep(0.01)
                with self.cond:
                    self.pausing = False
                    self.cond.notify_all()
                self.pause_no += 1
            time.sleep(0.005)
        for t in threads:
            t.join()
        with self.lock:
            self.save("end")
        log("writer done%s" % (" (a request failed)" if self.failed else ""))
        return 0


# --- expectations ---------------------------------------------------------

def merge(granules, g, size):
    out = []
    for x in sorted(granules):
        start, end = x * g, min((x + 1) * g, size)
        if out and out[-1][0] + out[-1][1] == start:
            out[-1][1] = end - out[-1][0]
        else:
            out.append([start, end - start])
    return out


def expect_ranges(args):
    g = args.granularity
    granules = set()
    active = args.frm == "0"
    want = "A" if not args.sent else "S"
    for line in open(args.log):
        f = line.split()
        if not f:
            continue
        if f[0] == "P":
            if f[1] == args.frm:
                active = True
                continue
            if f[1] == args.to:
                break
            continue
        if active and f[0] == want:
            off, n = int(f[2]), int(f[3])
            for x in range(off // g, (off + n - 1) // g + 1):
                granules.add(x)
    print(json.dumps(merge(granules, g, args.size)))
    return 0


def covered(ranges):
    s = set()
    for off, n in ranges:
        s.update(range(off, off + n, 512))
    return s


def check_changed(args):
    reply = json.load(open(args.reply))
    if not reply.get("ok"):
        print("changed failed: %s" % reply.get("error"))
        return 1
    got = [[r["offset"], r["length"]] for r in reply["ranges"]]
    bad = 0
    if sum(n for _, n in got) != reply["bytes"]:
        print("\"bytes\" %d is not the sum of the ranges" % reply["bytes"])
        bad += 1
    for (o1, n1), (o2, n2) in zip(got, got[1:]):
        if o1 + n1 >= o2:
            print("ranges not in order or not merged: %r %r" % ((o1, n1), (o2, n2)))
            bad += 1
    if args.expect:
        want = json.load(open(args.expect))
        if got != want:
            gs, ws = covered(got), covered(want)
            print("ranges differ from the writes made: %d sectors "
                  "reported but not written, %d written but not reported "
                  "(first missing: %s, first extra: %s)" %
                  (len(gs - ws), len(ws - gs),
                   min(ws - gs) if ws - gs else None,
                   min(gs - ws) if gs - ws else None))
            bad += 1
        else:
            print("ranges equal the granules written (%d ranges, %d bytes)"
                  % (len(got), reply["bytes"]))
    if args.superset_of:
        lo = covered(json.load(open(args.superset_of)))
        hi = covered(json.load(open(args.subset_of)))
        gs = covered(got)
        if not lo <= gs:
            print("%d acknowledged sectors missing from the ranges (first "
                  "at %d)" % (len(lo - gs), min(lo - gs)))
            bad += 1
        elif not gs <= hi:
            print("%d sectors reported that were never written (first at "
                  "%d)" % (len(gs - hi), min(gs - hi)))
            bad += 1
        else:
            print("ranges hold every acknowledged write and only sent ones "
                  "(%d bytes)" % reply["bytes"])
    if args.old:
        old = open(args.old, "rb").read()
        new = open(args.new, "rb").read()
        size = len(old)
        mask = bytearray(size // 512 + 1)
        for off, n in got:
            for s in range(off // 512, (off + n + 511) // 512):
                mask[s] = 1
        step = 65536
        diffs = 0
        for base in range(0, size, step):
            if old[base:base + step] == new[base:base + step]:
                continue
            for i in range(base, min(base + step, size), 512):
                if old[i:i + 512] != new[i:i + 512] and not mask[i // 512]:
                    if diffs == 0:
                        print("bytes at %d differ but are not in the ranges" % i)
                    diffs += 1
        if diffs:
            print("%d sectors differ outside the reported ranges" % diffs)
            bad += 1
        else:
            print("every byte that differs lies in the ranges")
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("writer")
    w.add_argument("uri")
    w.add_argument("--size", type=int, required=True)
    w.add_argument("--dir", required=True)
    w.add_argument("--model", required=True)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--threads", type=int, default=4)
    w.add_argument("--max-len", type=int, default=65536)
    w.add_argument("--sleep", type=float, default=0.02)
    w.add_argument("--no-trim", action="store_true")
    e = sub.add_parser("expect-ranges")
    e.add_argument("log")
    e.add_argument("--granularity", type=int, required=True)
    e.add_argument("--size", type=int, required=True)
    e.add_argument("--from", dest="frm", default="0")
    e.add_argument("--to", default="end")
    e.add_argument("--sent", action="store_true")
    e.add_argument("--acked", action="store_true")
    c = sub.add_parser("check-changed")
    c.add_argument("reply")
    c.add_argument("--expect")
    c.add_argument("--superset-of")
    c.add_argument("--subset-of")
    c.add_argument("--old")
    c.add_argument("--new")
    a = p.parse_args()
    if a.cmd == "writer":
        return Writer(a).run()
    if a.cmd == "expect-ranges":
        return expect_ranges(a)
    return check_changed(a)


if __name__ == "__main__":
    sys.exit(main())
