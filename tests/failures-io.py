#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# NBD client helper for the failure tests (test-flush-merge.sh,
# test-enospc-snapshot.sh, test-origin-truncated.sh, ...).  Run it with
# /usr/bin/python3 (the interpreter that has the nbd module).
#
#   write URI OFF LEN [--seed S] [--model FILE] [--fua] [--expect E]
#       One write of LEN random bytes at OFF.  E is "ok" (default) or an
#       errno name (ENOSPC, EIO, ...) the write must fail with.  A write
#       that succeeds is applied to the model file, if given.
#
#   writes URI --chunks FIRST:COUNT --chunk-size C [--seed S]
#          [--model FILE] [--results FILE]
#       One whole-chunk write to each of COUNT chunks from FIRST, in
#       order, carrying on after failures.  Each write that succeeds is
#       applied to the model; --results gets "CHUNK ok" or "CHUNK ERRNO"
#       per line.  Prints the number of successes and failures per errno.
#
#   read URI OFF LEN [--model FILE] [--expect E]
#       One read; with "ok" (default) the data must equal the model's
#       bytes there (if a model is given), else the read must fail with E.
#
#   zero URI OFF LEN [--expect E]
#       One zero request (NBD_CMD_WRITE_ZEROES).
#
#   flush URI
#       One flush.
#
# Exit 0 when every expectation holds, 1 otherwise (with a message), 2
# if connecting fails.

import argparse
import random
import sys

import nbd

from snapfg_test import log, close, errno_name
import snapfg_test


def connect(uri):
    """A handle that lets unaligned requests through (the tests send them
    on purpose); exit 2 if connecting fails."""
    try:
        return snapfg_test.connect(uri, strict_align=False)
    except nbd.Error as e:
        log("cannot connect to %s: %s" % (uri, e), file=sys.stderr)
        sys.exit(2)


def model_write(path, off, data):
    if path:
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(data)


def model_read(path, off, n):
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def outcome(fn):
    try:
        return "ok", fn()
    except nbd.Error as e:
        return errno_name(e), None


def cmd_write(a):
    rng = random.Random(a.seed)
    data = rng.randbytes(a.len)
    h = connect(a.uri)
    flags = nbd.CMD_FLAG_FUA if a.fua else 0
    got, _ = outcome(lambda: h.pwrite(data, a.off, flags))
    close(h)
    if got == "ok":
        model_write(a.model, a.off, data)
    if got != a.expect:
        print("failures-io: write of %d bytes at %d: %s, expected %s"
              % (a.len, a.off, got, a.expect))
        return 1
    print("write %d@%d: %s" % (a.len, a.off, got))
    return 0


def cmd_writes(a):
    first, count = (int(x) for x in a.chunks.split(":"))
    rng = random.Random(a.seed)
    h = connect(a.uri)
    counts = {}
    lines = []
    for c in range(first, first + count):
        data = rng.randbytes(a.chunk_size)
        got, _ = outcome(lambda: h.pwrite(data, c * a.chunk_size))
        if got == "ok":
            model_write(a.model, c * a.chunk_size, data)
        counts[got] = counts.get(got, 0) + 1
        lines.append("%d %s\n" % (c, got))
    close(h)
    if a.results:
        with open(a.results, "w") as f:
            f.writelines(lines)
    print(" ".join("%s=%d" % kv for kv in sorted(counts.items())))
    return 0


def cmd_read(a):
    h = connect(a.uri)
    got, data = outcome(lambda: h.pread(a.len, a.off))
    close(h)
    if got != a.expect:
        print("failures-io: read of %d bytes at %d: %s, expected %s"
              % (a.len, a.off, got, a.expect))
        return 1
    if got == "ok" and a.model:
        want = model_read(a.model, a.off, a.len)
        if data != want:
            bad = next(i for i in range(a.len) if data[i] != want[i])
            print("failures-io: read of %d bytes at %d differs from the "
                  "model from byte %d on" % (a.len, a.off, a.off + bad))
            return 1
    print("read %d@%d: %s" % (a.len, a.off, got))
    return 0


def cmd_zero(a):
    h = connect(a.uri)
    got, _ = outcome(lambda: h.zero(a.len, a.off))
    close(h)
    if got != a.expect:
        print("failures-io: zero of %d bytes at %d: %s, expected %s"
              % (a.len, a.off, got, a.expect))
        return 1
    print("zero %d@%d: %s" % (a.len, a.off, got))
    return 0


def cmd_flush(a):
    h = connect(a.uri)
    got, _ = outcome(lambda: h.flush())
    close(h)
    if got != "ok":
        print("failures-io: flush: %s" % got)
        return 1
    print("flush: ok")
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("write")
    s.add_argument("uri")
    s.add_argument("off", type=int)
    s.add_argument("len", type=int)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--model")
    s.add_argument("--fua", action="store_true")
    s.add_argument("--expect", default="ok")
    s = sub.add_parser("writes")
    s.add_argument("uri")
    s.add_argument("--chunks", required=True)
    s.add_argument("--chunk-size", type=int, required=True)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--model")
    s.add_argument("--results")
    s = sub.add_parser("read")
    s.add_argument("uri")
    s.add_argument("off", type=int)
    s.add_argument("len", type=int)
    s.add_argument("--model")
    s.add_argument("--expect", default="ok")
    s = sub.add_parser("zero")
    s.add_argument("uri")
    s.add_argument("off", type=int)
    s.add_argument("len", type=int)
    s.add_argument("--expect", default="ok")
    s = sub.add_parser("flush")
    s.add_argument("uri")
    a = p.parse_args()
    return {"write": cmd_write, "writes": cmd_writes, "read": cmd_read,
            "zero": cmd_zero, "flush": cmd_flush}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
