#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# NBD client helper for the run-time control tests (test-control*.sh,
# test-merge.sh, test-block-size-change.sh).  Run it with /usr/bin/python3
# (the interpreter that has the nbd module).
# What it shares with the other helpers is in snapfg_test.py.
#
#   read URI OFFSET LEN
#       One read; prints "ok" or "errno NAME" (exit 2 if connecting fails).
#
#   writes URI --list OFF:LEN[,OFF:LEN...] [--seed S] [--model FILE]
#       Writes of random data, in order; applied to the model file too.
#
#   write-loop URI --seed S --stop-file F [--model FILE] [--region OFF:LEN]
#              [--max-len L] [--align A] [--ready-file R]
#       Random writes (one at a time) until F exists; each acknowledged
#       write is applied to the model.  R is created after the first write.
#       Prints how many writes were made.
#
#   io-loop URI --seed S --stop-file F --model FILE [--region OFF:LEN]
#           [--min-ops N] [--ready-file R]
#       Random reads and writes, one at a time, in the region; every read
#       must equal the model (which the writes update).  Runs until F
#       exists and at least N operations were made.  Used to check the
#       origin during a merge.
#
#   drop-reader URI --expect FILE --ready-file R [--timeout S]
#       Streams the export (64 KiB reads, wrapping around), each read
#       compared with FILE, until a read fails; R is created after the
#       first 16 reads.  The failure must be EIO, and the next reads (on
#       the same connection) must fail with EIO too.  Exit 0 if so.
#
#   load --sock SOCK --ctl SNAPFGCTL --ctl-sock CTL --original FILE
#        --snap NAME,COW,STORE,CHUNK [--snap ...] [--writers W]
#        [--blocks K] [--block-size B] [--gap S] [--log-dir D]
#       Snapshots taken under load: see test-control-load.sh.
#
#   bs-clients --sock SOCK --original FILE --region OFF:LEN --stop-file F
#              --writable SNAPSHOT
#       New connections one after another while the block size changes:
#       see test-block-size-change.sh.

import argparse
import os
import random
import struct
import subprocess
import sys
import threading
import time

import nbd

from snapfg_test import (log, connect, close, errno_name, parse_region,
                         random_request, Model, add_read_command,
                         write_random, flush_close_save, skip_part)


# --- small commands ---------------------------------------------------

def cmd_writes(a):
    rng = random.Random(a.seed)
    model = Model(a.model)
    h = connect(a.uri)
    n = 0
    for part in a.list.split(","):
        off, length = (int(x, 0) for x in part.split(":"))
        write_random(h, rng, model, off, length)
        n += 1
    flush_close_save(h, model)
    print("ok %d writes" % n)


def cmd_write_loop(a):
    rng = random.Random(a.seed)
    model = Model(a.model)
    h = connect(a.uri)
    roff, rlen = parse_region(a.region, h.get_size())
    n = 0
    while not os.path.exists(a.stop_file):
        off, length = random_request(rng, roff, rlen, a.max_len, a.align)
        write_random(h, rng, model, off, length)
        n += 1
        if n == 1 and a.ready_file:
            open(a.ready_file, "w").close()
    flush_close_save(h, model)
    print("ok %d writes" % n)


def cmd_io_loop(a):
    rng = random.Random(a.seed)
    model = Model(a.model)
    h = connect(a.uri)
    roff, rlen = parse_region(a.region, h.get_size())
    writes = reads = 0
    bad = 0
    while not os.path.exists(a.stop_file) or writes + reads < a.min_ops:
        off, length = random_request(rng, roff, rlen, a.max_len, 512)
        if rng.randrange(2) == 0:
            write_random(h, rng, model, off, length)
            writes += 1
        else:
            got = h.pread(length, off)
            want = bytes(model.data[off:off + length])
            reads += 1
            if got != want:
                first = next(i for i in range(length) if got[i] != want[i])
                log("FAIL: read [%d, +%d) differs from the model at byte "
                    "%d (offset %d)" % (off, length, first, off + first))
                bad += 1
                if bad >= 5:
                    break
        if writes + reads == 1 and a.ready_file:
            open(a.ready_file, "w").close()
    flush_close_save(h, model)
    log("io-loop: %d writes, %d reads compared, %d mismatches"
        % (writes, reads, bad))
    sys.exit(1 if bad else 0)


def cmd_drop_reader(a):
    expect = open(a.expect, "rb").read()
    h = connect(a.uri)
    size = h.get_size()
    piece = 65536
    off = 0
    n = 0
    deadline = time.monotonic() + a.timeout
    first_err = None
    while time.monotonic() < deadline:
        length = min(piece, size - off)
        try:
            got = h.pread(length, off)
        except nbd.Error as e:
            first_err = e
            break
        if got != expect[off:off + length]:
            log("FAIL: read %d at offset %d returned wrong data" % (n, off))
            sys.exit(1)
        n += 1
        if n == 16 and a.ready_file:
            open(a.ready_file, "w").close()
        off = (off + length) % size
    if first_err is None:
        log("FAIL: no read failed within %d s (%d reads)" % (a.timeout, n))
        sys.exit(1)
    log("%d correct reads, then read at offset %d failed: %s (errno %s)"
        % (n, off, first_err.string, errno_name(first_err)))
    rc = 0
    if first_err.errno != "EIO":
        log("FAIL: expected EIO")
        rc = 1
    for i in range(3):
        try:
            h.pread(4096, (i * 1048576) % size)
            log("FAIL: a later read on the dropped snapshot succeeded")
            rc = 1
        except nbd.Error as e:
            if e.errno != "EIO":
                log("FAIL: later read failed with errno %s, expected EIO"
                    % errno_name(e))
                rc = 1
    if rc == 0:
        log("the next 3 reads on the same connection failed with EIO too")
    close(h)
    sys.exit(rc)


# --- snapshots under load ------------------------------------------------
#
# Writer w owns the blocks j*W + w (j = 0..K-1) of the export: the writers'
# blocks interleave, so a chunk bigger than a block holds blocks of several
# writers.  Writer w's write number s goes to its block s % K, and the
# block's whole contents are a function of (w, s): a header "SNAPFGLD",
# w, s, then a filler derived from them.  A writer has one write in
# flight at a time and records, for each, when it was issued (before the
# call) and when it was acknowledged (after the call returned).
#
# A snapshot taken at one instant holds, for each writer, exactly the
# writes with s <= k_w for some cut k_w: block j holds the last write
# s <= k_w with s % K == j, or the original data if there is none.  The
# cuts must also agree with real time:
#   - every write acknowledged before "create" was sent is in it;
#   - no write issued after "create" returned is in it;
#   - across writers: if a write is missing, no write issued after it
#     was acknowledged may be present.

MAGIC = b"SNAPFGLD"


def stamp_block(w, s, bs):
    head = MAGIC + struct.pack("<IQ", w, s)
    unit = struct.pack("<IQI", w, s, 0x5a5aa5a5 ^ (s * 2654435761 & 0xffffffff))
    body = (unit * (bs // len(unit) + 1))[:bs - len(head)]
    return head + body


class Writer(threading.Thread):
    def __init__(self, uri, w, W, K, bs, stop):
        super().__init__()
        self.uri, self.w, self.W, self.K, self.bs = uri, w, W, K, bs
        self.stop = stop
        self.issued = []        # issue time of write s
        self.acked = []         # ack time of write s
        self.error = None

    def offset(self, j):
        return (j * self.W + self.w) * self.bs

    def run(self):
        try:
            h = connect(self.uri)
            s = 0
            while not self.stop.is_set():
                data = stamp_block(self.w, s, self.bs)
                self.issued.append(time.monotonic())
                h.pwrite(data, self.offset(s % self.K))
                self.acked.append(time.monotonic())
                s += 1
            close(h)
        except Exception as e:
            self.error = e


def read_all(uri, size):
    h = connect(uri)
    out = bytearray()
    for off in range(0, size, 262144):
        out += h.pread(min(262144, size - off), off)
    close(h)
    return bytes(out)


def check_snapshot(name, img, original, writers, t0, t1, region_end):
    """Returns (ok, cuts)."""
    problems = []
    cuts = []
    for wr in writers:
        w, K, bs = wr.w, wr.K, wr.bs
        seen = {}
        for j in range(K):
            off = wr.offset(j)
            blk = img[off:off + bs]
            if blk == original[off:off + bs]:
                continue
            if blk[:8] != MAGIC:
                problems.append("writer %d block %d: neither original data "
                                "nor a stamp" % (w, j))
                continue
            bw, bseq = struct.unpack("<IQ", blk[8:20])
            if bw != w or bseq % K != j or blk != stamp_block(w, bseq, bs):
                problems.append("writer %d block %d: bad or torn stamp "
                                "(writer %d seq %d)" % (w, j, bw, bseq))
                continue
            seen[j] = bseq
        k = max(seen.values()) if seen else -1
        cuts.append(k)
        if k >= len(wr.issued):
            problems.append("writer %d: seq %d was never written" % (w, k))
            continue
        # Prefix: every block holds the last write <= k to it.
        for j in range(K):
            last = k - ((k - j) % K) if k >= j else -1
            got = seen.get(j, -1)
            if got != last:
                problems.append("writer %d block %d holds %s, but the cut "
                                "at seq %d needs %s" %
                                (w, j, got if got >= 0 else "original data",
                                 k, last if last >= 0 else "original data"))
        # Real time.
        acked_before = [s for s, t in enumerate(wr.acked) if t < t0]
        if acked_before and k < acked_before[-1]:
            problems.append("writer %d: write %d was acknowledged before "
                            "create was sent, but the snapshot only has "
                            "writes up to %d" % (w, acked_before[-1], k))
        issued_after = [s for s, t in enumerate(wr.issued) if t > t1]
        if issued_after and k >= issued_after[0]:
            problems.append("writer %d: the snapshot has write %d, issued "
                            "after create returned" % (w, issued_after[0]))
    # Across writers: a missing write of w1 acknowledged before a present
    # write of w2 was issued.
    for a, wa in enumerate(writers):
        miss = cuts[a] + 1
        if miss >= len(wa.acked):
            continue
        for b, wb in enumerate(writers):
            if a == b or cuts[b] < 0:
                continue
            if wa.acked[miss] < wb.issued[cuts[b]]:
                problems.append("not one instant: writer %d's write %d was "
                                "acknowledged before writer %d's write %d "
                                "was issued; the snapshot has the later one "
                                "but not the earlier" % (a, miss, b, cuts[b]))
    # Outside the writers' blocks: the original data.
    if img[region_end:] != original[region_end:]:
        problems.append("data outside the writers' region changed")
    for p in problems[:10]:
        log("FAIL: %s: %s" % (name, p))
    return not problems, cuts


def cmd_load(a):
    original = open(a.original, "rb").read()
    size = len(original)
    W, K, bs = a.writers, a.blocks, a.block_size
    region_end = W * K * bs
    if region_end > size:
        sys.exit("region larger than the image")
    origin_uri = "nbd+unix:///origin?socket=%s" % a.sock
    stop = threading.Event()
    writers = [Writer(origin_uri, w, W, K, bs, stop) for w in range(W)]
    log("%d writers, %d blocks of %d bytes each, interleaved" % (W, K, bs))
    for wr in writers:
        wr.start()
    ok = True
    snaps = []
    # How many creates had a write complete while they ran: what "create
    # under load" is about.  None of them is a premise not met.
    overlapped = 0
    time.sleep(a.gap)
    for spec in a.snap:
        name, cow, store, chunk = spec.split(",")
        cmd = [a.ctl, "-S", a.ctl_sock, "create", name, "--cow", cow,
               "--store", store, "--chunk-size", chunk]
        counts = [len(wr.acked) for wr in writers]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        t1 = time.monotonic()
        after = [len(wr.acked) for wr in writers]
        if r.returncode != 0:
            log("FAIL: %s exited %d: %s" % (" ".join(cmd), r.returncode,
                                            r.stderr.strip()))
            ok = False
            break
        log("created %s (%s, chunk %s) under load in %.1f ms; writes "
            "acknowledged so far per writer: %s" %
            (name, store, chunk, (t1 - t0) * 1000, counts))
        if after == counts:
            log("no write completed while create %s ran" % name)
        else:
            overlapped += 1
        snaps.append((name, t0, t1))
        # Check it at once, with the writers still going.
        img = read_all("nbd+unix:///%s?socket=%s" % (name, a.sock), size)
        good, cuts = check_snapshot(name + " (read under load)", img,
                                    original, writers, t0, t1, region_end)
        ok = ok and good
        log("%s read under load: cut per writer %s: %s" %
            (name, cuts, "ok" if good else "WRONG"))
        time.sleep(a.gap)
    # The test's "changed" check needs every writer to have rewritten each
    # of its K blocks after the last snapshot.  A gap of time does not
    # promise that on a loaded machine: wait for the writes themselves.
    if snaps:
        base = [len(wr.acked) for wr in writers]
        deadline = time.monotonic() + 60
        while (any(len(wr.acked) < b + K for wr, b in zip(writers, base))
               and not any(wr.error for wr in writers)
               and time.monotonic() < deadline):
            time.sleep(0.05)
        short = [wr.w for wr, b in zip(writers, base) if len(wr.acked) < b + K]
        if short:
            log("after 60 s writers %s had not rewritten all their %d "
                "blocks since the last snapshot (the test's changed check "
                "fails on that)" % (short, K))
    if snaps and overlapped == 0:
        skip_part("no write completed while any of the %d creates ran: "
                  "a create racing acknowledged writes was not exercised"
                  % len(snaps))
    stop.set()
    for wr in writers:
        wr.join()
        if wr.error:
            log("FAIL: writer %d: %s" % (wr.w, wr.error))
            ok = False
    total = sum(len(wr.acked) for wr in writers)
    log("writers stopped after %d writes in all" % total)
    # Every snapshot again, now that the writers have moved on: still its
    # own instant, the same one.
    for name, t0, t1 in snaps:
        img = read_all("nbd+unix:///%s?socket=%s" % (name, a.sock), size)
        good, cuts2 = check_snapshot(name + " (read at the end)", img,
                                     original, writers, t0, t1, region_end)
        ok = ok and good
        log("%s read at the end: cut per writer %s: %s" %
            (name, cuts2, "ok" if good else "WRONG"))
    if a.log_dir:
        for wr in writers:
            with open(os.path.join(a.log_dir, "writer%d.log" % wr.w), "w") as f:
                for s, (ti, ta) in enumerate(zip(wr.issued, wr.acked)):
                    f.write("%d %d %.6f %.6f\n" % (s, s % K, ti, ta))
        with open(os.path.join(a.log_dir, "snapshots.log"), "w") as f:
            for name, t0, t1 in snaps:
                f.write("%s %.6f %.6f\n" % (name, t0, t1))
    # The origin is the last write of each block.
    img = read_all(origin_uri, size)
    for wr in writers:
        n = len(wr.acked)
        for j in range(K):
            last = n - 1 - ((n - 1 - j) % K) if n - 1 >= j else -1
            off = wr.offset(j)
            want = stamp_block(wr.w, last, bs) if last >= 0 else original[off:off + bs]
            if img[off:off + bs] != want:
                log("FAIL: origin: writer %d block %d does not hold its last "
                    "write %d" % (wr.w, j, last))
                ok = False
                break
    if ok:
        log("origin holds every writer's last writes")
    sys.exit(0 if ok else 1)


# --- block size changes ----------------------------------------------------

def cmd_bs_clients(a):
    """Cycle over three exports: origin (reads of the region, which
    nobody else writes, against the original), the start-up snapshot
    (reads anywhere against the original) and a run-time snapshot (reads
    anywhere and writes in the region, against a model)."""
    original = open(a.original, "rb").read()
    rng = random.Random(a.seed)
    roff, rlen = parse_region(a.region, len(original))
    model = bytearray(original)
    seen = {}
    conns = 0
    bad = 0
    i = 0
    exports = ["origin", "snapshot", a.writable]
    while not os.path.exists(a.stop_file):
        export = exports[i % 3]
        i += 1
        h = connect("nbd+unix:///%s?socket=%s" % (export, a.sock))
        mn = h.get_block_size(nbd.SIZE_MINIMUM)
        seen[mn] = seen.get(mn, 0) + 1
        conns += 1
        if mn not in (512, 4096):
            log("FAIL: connection %d: minimum block size %d" % (i, mn))
            bad += 1
        for _ in range(4):
            length = mn * rng.randrange(1, 17)
            if export == "snapshot" or (export == a.writable and rng.randrange(2)):
                lo, span = 0, len(original)
            else:
                lo, span = roff, rlen
            off = lo + rng.randrange(0, (span - length) // mn + 1) * mn
            if export == a.writable and lo == roff and rng.randrange(2) == 0:
                data = rng.randbytes(length)
                h.pwrite(data, off)
                model[off:off + length] = data
                continue
            got = h.pread(length, off)
            want = (model if export == a.writable else original)[off:off + length]
            if got != want:
                log("FAIL: %s read [%d, +%d) (block size %d) returned wrong "
                    "data" % (export, off, length, mn))
                bad += 1
        close(h)
    # The writable snapshot as a whole at the end.
    h = connect("nbd+unix:///%s?socket=%s" % (a.writable, a.sock))
    for off in range(0, len(original), 262144):
        n = min(262144, len(original) - off)
        if h.pread(n, off) != bytes(model[off:off + n]):
            log("FAIL: %s [%d, +%d) differs from the model" % (a.writable, off, n))
            bad += 1
    close(h)
    log("bs-clients: %d new connections; minimum block sizes seen: %s; %d "
        "problems" % (conns, ", ".join("%d: %d" % kv for kv in sorted(seen.items())),
                      bad))
    if conns and len(seen) < 2 and not a.allow_one:
        log("FAIL: only one minimum block size seen by new connections")
        bad += 1
    sys.exit(1 if bad else 0)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)

    add_read_command(sub)

    s = sub.add_parser("writes")
    s.add_argument("uri")
    s.add_argument("--list", required=True)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--model")
    s.set_defaults(fn=cmd_writes)

    s = sub.add_parser("write-loop")
    s.add_argument("uri")
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--stop-file", required=True)
    s.add_argument("--model")
    s.add_argument("--region")
    s.add_argument("--max-len", type=int, default=65536)
    s.add_argument("--align", type=int, default=512)
    s.add_argument("--ready-file")
    s.set_defaults(fn=cmd_write_loop)

    s = sub.add_parser("io-loop")
    s.add_argument("uri")
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--stop-file", required=True)
    s.add_argument("--model", required=True)
    s.add_argument("--region")
    s.add_argument("--max-len", type=int, default=32768)
    s.add_argument("--min-ops", type=int, default=1)
    s.add_argument("--ready-file")
    s.set_defaults(fn=cmd_io_loop)

    s = sub.add_parser("drop-reader")
    s.add_argument("uri")
    s.add_argument("--expect", required=True)
    s.add_argument("--ready-file")
    s.add_argument("--timeout", type=int, default=60)
    s.set_defaults(fn=cmd_drop_reader)

    s = sub.add_parser("load")
    s.add_argument("--sock", required=True)
    s.add_argument("--ctl", required=True)
    s.add_argument("--ctl-sock", required=True)
    s.add_argument("--original", required=True)
    s.add_argument("--snap", action="append", required=True)
    s.add_argument("--writers", type=int, default=4)
    s.add_argument("--blocks", type=int, default=64)
    s.add_argument("--block-size", type=int, default=4096)
    s.add_argument("--gap", type=float, default=1.0)
    s.add_argument("--log-dir")
    s.set_defaults(fn=cmd_load)

    s = sub.add_parser("bs-clients")
    s.add_argument("--sock", required=True)
    s.add_argument("--original", required=True)
    s.add_argument("--region", required=True)
    s.add_argument("--stop-file", required=True)
    s.add_argument("--writable", required=True)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--allow-one", action="store_true")
    s.set_defaults(fn=cmd_bs_clients)

    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
