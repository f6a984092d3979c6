#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
"""Clients for tests/test-writeback.sh: write-back of first writes.

Each command connects to a running snapfg server on SOCK, does its
requests, checks what it can see through NBD and in the origin FILE
itself (read directly, byte for byte), prints "ok ..." lines and exits
1 after printing "BAD ..." for each broken expectation.

  held SOCK ORIGIN PRISTINE MODEL PAUSE
      The committer is paused (PAUSE exists).  Writes, an overwrite of a
      held chunk, a zero and a multi-chunk write go to the origin on two
      connections; each connection reads the other's writes; the
      snapshot reads the pristine data; the origin file has none of it
      yet.  A FUA write to a new chunk is in the file when it returns.
      Then PAUSE is removed and a flush on one connection puts every
      write in the file.  MODEL gets what the origin must hold.
  held-reads SOCK ORIGIN PRISTINE MODEL PAUSE SEED
      The committer is paused.  Writes and zeroes of many sizes, from
      512 bytes to over 4 MiB (more than the read index's 64 KiB
      granules allow a write to be linked in: those are "wide"), at
      512-byte offsets, overlapping each other, from two connections;
      after each, a read around it on either connection matches the
      model, as does the whole disk at the end, and the origin file is
      still pristine.  After a flush the file holds every write.
  fua-after-held SOCK ORIGIN MODEL
      A write, then a FUA write over part of it: the file has both, in
      order, when the FUA write returns.
  backpressure SOCK ORIGIN MODEL PAUSE COUNT
      COUNT 4K first writes, one after another (the caller watches the
      stats for a writer waiting for room and then removes PAUSE); all
      succeed; after a flush the file holds them.
  fill SOCK MODEL COUNT SEED
      COUNT 4K first writes, no flush (for the clean-stop check).
  flush-fails SOCK PAUSE
      Two connections open before the failure (PAUSE is removed once they
      are): each one's next flush
      fails with EIO, the flush after it succeeds; a connection opened
      later flushes fine.
  copy-read-fails SOCK PRISTINE PAUSE TRIGGER
      The committer is paused and the origin's reads fail while TRIGGER
      exists.  A first write A (8K at 2M) is acknowledged: its copy is
      the committer's.  A second write B over the chunk before A and
      A's first chunk waits for A's chunk, so the paused committer makes
      both copies, and both reads fail: B fails with EIO, A is dropped.
      Once TRIGGER and PAUSE are removed, the next flush on every
      connection open before fails with EIO, the one after succeeds;
      origin and snapshot read the pristine data there; A written again
      lands.
  not-held SOCK ORIGIN PRISTINE MODEL PAUSE FIRST|OVER
      The server runs with SNAPFG_TEST_FAIL_AT=held-data:1 (FIRST) or
      :3 (OVER), the committer paused: storing that write's data fails,
      as when memory runs out.  FIRST: a first write that cannot be held
      goes the way writeback=off takes: it is on the origin file when it
      returns, the snapshot keeps the old data; a first write after it
      is held again.  OVER: after two held writes, a write within
      their chunks that cannot be held itself waits until they are
      applied (it does not return while the committer is paused), then
      lands after them.  Either way the request succeeds, and after a flush the file holds
      every write in order.
  write SOCK OFFSET LENGTH BYTE
      One write, no flush.
"""

import errno
import os
import random
import sys

import nbd

from snapfg_test import connect_unix, close, log

bad = 0


def check(what, good):
    global bad
    print(("ok " if good else "BAD ") + what, flush=True)
    if not good:
        bad += 1


def read_file(path, off, n):
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def load(path):
    with open(path, "rb") as f:
        return bytearray(f.read())


def save(path, img):
    with open(path, "wb") as f:
        f.write(img)


def cmd_held(sock, origin, pristine, model_path, pause):
    model = load(model_path)
    orig = load(pristine)
    a = connect_unix(sock, "origin")
    b = connect_unix(sock, "")
    s = connect_unix(sock, "snapshot")
    M = 1024 * 1024

    # A first write on a, read on b.
    x = os.urandom(4096)
    a.pwrite(x, 1 * M)
    model[1 * M:1 * M + 4096] = x
    check("a held write reads back on another connection",
          b.pread(4096, 1 * M) == x)

    # Overwrites of the held chunk, in order, from both connections.
    y = os.urandom(4096)
    b.pwrite(y, 1 * M)
    model[1 * M:1 * M + 4096] = y
    z = os.urandom(512)
    a.pwrite(z, 1 * M + 1024)
    model[1 * M + 1024:1 * M + 1536] = z
    check("overwrites of a held chunk apply in order (connection a)",
          a.pread(8192, 1 * M) == bytes(model[1 * M:1 * M + 8192]))
    check("overwrites of a held chunk apply in order (connection b)",
          b.pread(8192, 1 * M) == bytes(model[1 * M:1 * M + 8192]))

    # A write over many chunks, and a zero.
    w = os.urandom(65536 + 512)
    a.pwrite(w, 3 * M - 512)
    model[3 * M - 512:3 * M + 65536] = w
    b.zero(8192, 5 * M)
    model[5 * M:5 * M + 8192] = bytes(8192)
    check("a multi-chunk held write reads back",
          b.pread(len(w), 3 * M - 512) == w)
    check("a held zero reads back as zeroes",
          a.pread(8192, 5 * M) == bytes(8192))
    # A read that covers held and unheld data.
    check("a read across held and unheld data",
          b.pread(4 * M, 2 * M) == bytes(model[2 * M:6 * M]))

    # The snapshot is unchanged.
    for off, n in ((1 * M, 8192), (3 * M - 512, 65536 + 512), (5 * M, 8192)):
        check("the snapshot reads the pristine data at %d" % off,
              s.pread(n, off) == bytes(orig[off:off + n]))

    # The committer is paused: none of it is on the origin file yet.
    for off, n in ((1 * M, 8192), (3 * M - 512, 65536 + 512), (5 * M, 8192)):
        check("held data is not on the origin file yet at %d" % off,
              read_file(origin, off, n) == bytes(orig[off:off + n]))

    # FUA to a chunk no held write touches: on the file when it returns.
    f = os.urandom(4096)
    b.pwrite(f, 7 * M, nbd.CMD_FLAG_FUA)
    model[7 * M:7 * M + 4096] = f
    check("a FUA first write is on the origin file when it returns",
          read_file(origin, 7 * M, 4096) == f)

    # A flush after the pause ends: everything is on the file.
    os.unlink(pause)
    a.flush()
    check("after a flush the origin file holds every write, byte for byte",
          load(origin) == model)
    check("after the flush the snapshot is still pristine",
          s.pread(len(orig), 0) == bytes(orig))
    for h in (a, b, s):
        close(h)
    save(model_path, model)


def cmd_held_reads(sock, origin, pristine, model_path, pause, seed):
    rnd = random.Random(int(seed))
    model = load(model_path)
    orig = load(pristine)
    size = len(model)
    conns = (connect_unix(sock, "origin"), connect_unix(sock, ""))
    K = 1024
    M = K * K
    write_sizes = (512, 4 * K, 4 * K + 512, 64 * K, 64 * K + 512, 192 * K,
                   M, M + 4 * K, 4 * M + 512)
    read_sizes = (512, 4 * K, 64 * K, 128 * K + 512, M, 3 * M)
    stale = []
    for i in range(150):
        n = rnd.choice(write_sizes)
        off = rnd.randrange(0, (size - n) // 512 + 1) * 512
        h = rnd.choice(conns)
        if rnd.random() < 0.15:
            h.zero(n, off)
            model[off:off + n] = bytes(n)
        else:
            data = rnd.randbytes(n)
            h.pwrite(data, off)
            model[off:off + n] = data
        rn = rnd.choice(read_sizes)
        roff = min(max(0, off + rnd.randrange(-rn, n) // 512 * 512), size - rn)
        if rnd.choice(conns).pread(rn, roff) != bytes(model[roff:roff + rn]):
            stale.append((i, roff, rn))
    check("150 reads around held writes of 512 bytes to 4 MiB match the "
          "model%s" % (": stale at " + repr(stale[:5]) if stale else ""),
          not stale)
    check("the whole origin export matches the model",
          conns[1].pread(size, 0) == bytes(model))
    check("none of it is on the origin file yet", load(origin) == orig)
    os.unlink(pause)
    conns[0].flush()
    check("after a flush the origin file holds every write",
          load(origin) == model)
    for h in conns:
        close(h)
    save(model_path, model)


def cmd_fua_after_held(sock, origin, model_path):
    model = load(model_path)
    h = connect_unix(sock, "origin")
    off = 9 * 1024 * 1024
    x = os.urandom(16384)
    h.pwrite(x, off)
    model[off:off + 16384] = x
    y = os.urandom(4096)
    h.pwrite(y, off + 4096, nbd.CMD_FLAG_FUA)
    model[off + 4096:off + 8192] = y
    check("a FUA write over a held one: both on the file, in order",
          read_file(origin, off, 16384) == bytes(model[off:off + 16384]))
    close(h)
    save(model_path, model)


def cmd_backpressure(sock, origin, model_path, pause, count):
    model = load(model_path)
    h = connect_unix(sock, "origin")
    for i in range(count):
        off = (i * 2 + 1) * 65536
        x = os.urandom(4096)
        h.pwrite(x, off)              # never an error, however full
        model[off:off + 4096] = x
    check("%d first writes past writeback-max all succeeded" % count, True)
    h.flush()
    check("after a flush the origin file holds them all",
          load(origin) == model)
    close(h)
    save(model_path, model)


def cmd_fill(sock, model_path, count, seed):
    import random
    rng = random.Random(seed)
    model = load(model_path)
    h = connect_unix(sock, "origin")
    for _ in range(count):
        off = rng.randrange(len(model) // 4096) * 4096
        x = rng.randbytes(4096)
        h.pwrite(x, off)
        model[off:off + 4096] = x
    close(h)
    save(model_path, model)
    check("%d writes acknowledged" % count, True)


def flush_errno(h):
    try:
        h.flush()
        return 0
    except nbd.Error as e:
        return e.errno


def check_next_flushes_fail(conns):
    """Each (name, handle)'s next flush fails with EIO; the first's next
    one after that succeeds."""
    for name, h in conns:
        e = flush_errno(h)
        check("the next flush on %s fails with EIO (got %s)" % (name, e),
              e in (errno.EIO, "EIO"))
    check("the flush after that on %s succeeds" % conns[0][0],
          flush_errno(conns[0][1]) == 0)


def cmd_flush_fails(sock, pause):
    a = connect_unix(sock, "origin")
    b = connect_unix(sock, "snapshot")
    os.unlink(pause)              # the committer goes on, and fails
    check_next_flushes_fail([("connection a", a), ("connection b", b)])
    c = connect_unix(sock, "origin")
    check("a connection opened later flushes fine", flush_errno(c) == 0)
    for h in (a, b, c):
        close(h)


def cmd_copy_read_fails(sock, pristine, pause, trigger):
    a = connect_unix(sock, "origin")
    b = connect_unix(sock, "snapshot")
    c = connect_unix(sock, "origin")
    a.pwrite(b"\x77" * 8192, 0x200000)
    check("write A, whose copy is the committer's, is acknowledged", True)
    try:
        c.pwrite(b"\x55" * 8192, 0x1ff000)
        check("write B fails, its copy's origin read failed", False)
    except nbd.Error as e:
        check("write B fails with EIO (got %s)" % e.errno,
              e.errno in (errno.EIO, "EIO"))
    os.unlink(trigger)
    os.unlink(pause)
    check_next_flushes_fail([("the origin", a), ("the snapshot", b)])
    want = read_file(pristine, 0x1ff000, 3 * 4096)
    check("the origin reads the old data where A and B failed",
          a.pread(3 * 4096, 0x1ff000) == want)
    check("the snapshot reads the old data there",
          b.pread(3 * 4096, 0x1ff000) == want)
    a.pwrite(b"\x77" * 8192, 0x200000)
    check("A written again and flushed", flush_errno(a) == 0)
    check("the origin reads A",
          a.pread(8192, 0x200000) == b"\x77" * 8192)
    check("the snapshot still reads the old data",
          b.pread(3 * 4096, 0x1ff000) == want)
    for h in (a, b, c):
        close(h)


def cmd_not_held(sock, origin, pristine, model_path, pause, case):
    model = load(model_path)
    orig = load(pristine)
    a = connect_unix(sock, "origin")
    s = connect_unix(sock, "snapshot")
    M = 1024 * 1024

    if case == "FIRST":
        x = os.urandom(4096)
        a.pwrite(x, 1 * M)
        model[1 * M:1 * M + 4096] = x
        check("a first write that cannot be held is on the origin file "
              "when it returns (the committer is paused)",
              read_file(origin, 1 * M, 4096) == x)
        check("it reads back", a.pread(4096, 1 * M) == x)
        check("the snapshot keeps the old data there",
              s.pread(4096, 1 * M) == bytes(orig[1 * M:1 * M + 4096]))
        y = os.urandom(4096)
        a.pwrite(y, 2 * M)
        model[2 * M:2 * M + 4096] = y
        check("the next first write is held again (not on the file yet)",
              read_file(origin, 2 * M, 4096) == bytes(orig[2 * M:2 * M + 4096]))
        check("it reads back", a.pread(4096, 2 * M) == y)
        os.unlink(pause)
    else:
        x = os.urandom(8192)
        a.pwrite(x, 1 * M)
        model[1 * M:1 * M + 8192] = x
        # A second write within it waits for the first one's copy (the
        # paused committer makes it for a writer that waits), and is
        # held behind it.
        w = os.urandom(1024)
        a.pwrite(w, 1 * M + 512)
        model[1 * M + 512:1 * M + 1536] = w
        check("the first two writes are held (not on the file yet)",
              read_file(origin, 1 * M, 8192) == bytes(orig[1 * M:1 * M + 8192]))
        # A third within them, its chunks copied now, on another
        # connection, cannot be held: it can only go after them.
        b = connect_unix(sock, "origin")
        y = os.urandom(4096)
        cookie = b.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(y)),
                              1 * M + 2048)
        model[1 * M + 2048:1 * M + 6144] = y
        for _ in range(20):
            b.poll(100)
        done = b.aio_command_completed(cookie)
        check("a write over a held one that cannot be held waits while the "
              "committer is paused", not done)
        os.unlink(pause)
        while not done:
            b.poll(-1)
            done = b.aio_command_completed(cookie)
        check("once the held write is applied it lands after it: the file "
              "holds both, in order, when it returns",
              read_file(origin, 1 * M, 8192) == bytes(model[1 * M:1 * M + 8192]))
        check("both read back in order",
              a.pread(8192, 1 * M) == bytes(model[1 * M:1 * M + 8192]))
        close(b)
    a.flush()
    check("after a flush the origin file holds every write, byte for byte",
          load(origin) == model)
    check("the snapshot is pristine", s.pread(len(orig), 0) == bytes(orig))
    for h in (a, s):
        close(h)
    save(model_path, model)


def cmd_write(sock, off, n, byte):
    h = connect_unix(sock, "origin")
    h.pwrite(bytes([byte]) * n, off)
    close(h)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "held":
        cmd_held(*args)
    elif cmd == "held-reads":
        cmd_held_reads(*args)
    elif cmd == "fua-after-held":
        cmd_fua_after_held(*args)
    elif cmd == "backpressure":
        cmd_backpressure(args[0], args[1], args[2], args[3], int(args[4]))
    elif cmd == "fill":
        cmd_fill(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "flush-fails":
        cmd_flush_fails(*args)
    elif cmd == "copy-read-fails":
        cmd_copy_read_fails(*args)
    elif cmd == "not-held":
        cmd_not_held(*args)
    elif cmd == "write":
        cmd_write(args[0], int(args[1], 0), int(args[2], 0), int(args[3], 0))
    else:
        log("unknown command %s" % cmd, file=sys.stderr)
        sys.exit(2)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
