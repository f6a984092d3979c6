# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Helpers for tests/test-client-drop.sh (run with the system Python,
# which has libnbd's nbd module).
#
#   client-drop.py drop URI SEED
#       Connect, queue 16-64 reads of 1-4 MiB at random offsets, let the
#       server start replying for a few milliseconds, and vanish:
#       os._exit without NBD_CMD_DISC, replies still in flight.
#   client-drop.py write URI START CAP ACKLOG STOPFILE
#       Write 512-byte blocks n = START, START+1, ... (block n at offset
#       n * 512, contents pattern(n)) until n reaches CAP, STOPFILE
#       appears or the server goes away.  Each write that the server
#       acknowledged is appended to ACKLOG ("n\n") before the next one
#       is sent, so ACKLOG lists exactly the acknowledged writes.
#   client-drop.py check IMAGE ORIGINAL ACKLOG NEXT
#       IMAGE is the origin as read back: every acknowledged block holds
#       its pattern; a block below NEXT that was sent but not
#       acknowledged holds its pattern or the original bytes; every
#       other block holds the original bytes.  Prints a summary.

import os
import random
import struct
import sys
import time

BLOCK = 512
MAGIC = 0x53464744524f5021     # "!POR DGFS"
MIB = 1024 * 1024


def pattern(n):
    return struct.pack('<QQ', MAGIC, n) * (BLOCK // 16)


def drop(uri, seed):
    import nbd
    rng = random.Random(seed)
    h = nbd.NBD()
    h.connect_uri(uri)
    size = h.get_size()
    bufs = []
    for _ in range(rng.randint(16, 64)):
        length = rng.randint(2, 8) * (MIB // 2)          # 1-4 MiB
        length = min(length, size)
        offset = rng.randrange(0, (size - length) // 4096 + 1) * 4096
        buf = nbd.Buffer(length)
        h.aio_pread(buf, offset)
        bufs.append(buf)
    # let the requests go out and the first replies start to flow
    end = time.monotonic() + rng.uniform(0.002, 0.05)
    while time.monotonic() < end:
        h.poll(1)
    sys.stdout.flush()
    os._exit(0)


def write(uri, start, cap, acklog, stopfile):
    import nbd
    h = nbd.NBD()
    try:
        h.connect_uri(uri)
    except nbd.Error as e:
        print("writer: cannot connect: %s" % e, file=sys.stderr)
        return 0
    fd = os.open(acklog, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    n = start
    try:
        while n < cap and not os.path.exists(stopfile):
            h.pwrite(pattern(n), n * BLOCK)
            os.write(fd, b"%d\n" % n)
            n += 1
        while not os.path.exists(stopfile):
            time.sleep(0.05)
        h.shutdown()
    except nbd.Error as e:
        # the server went away with write n in flight (or not yet sent)
        print("writer: write %d: %s" % (n, e), file=sys.stderr)
    os.close(fd)
    return 0


def check(image, original, acklog, next_n):
    with open(acklog) as f:
        acked = {int(x) for x in f.read().split()}
    img = open(image, 'rb').read()
    orig = open(original, 'rb').read()
    if len(img) != len(orig):
        print("size %d, expected %d" % (len(img), len(orig)))
        return 1
    bad = []
    unacked_new = unacked_old = 0
    for n in range(len(orig) // BLOCK):
        got = img[n * BLOCK:(n + 1) * BLOCK]
        old = orig[n * BLOCK:(n + 1) * BLOCK]
        if n in acked:
            ok = got == pattern(n)
        elif n < next_n:
            ok = got in (pattern(n), old)
            if got == pattern(n):
                unacked_new += 1
            else:
                unacked_old += 1
        else:
            ok = got == old
        if not ok:
            bad.append(n)
    if bad:
        print("%d bad blocks, first %s" % (len(bad), bad[:10]))
        return 1
    print("%d acknowledged writes intact; %d blocks skipped between rounds "
          "(in flight at a crash, or never sent: %d hold the new data, %d the "
          "old); the other blocks are the original"
          % (len(acked), unacked_new + unacked_old, unacked_new, unacked_old))
    return 0


def main():
    cmd = sys.argv[1]
    if cmd == 'drop':
        drop(sys.argv[2], int(sys.argv[3]))
    elif cmd == 'write':
        sys.exit(write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                       sys.argv[5], sys.argv[6]))
    elif cmd == 'check':
        sys.exit(check(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
    else:
        sys.exit("unknown command " + cmd)


main()
