#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Kill -9 loop for state= (tests/test-lifecycle-crash-loop.sh).
#
# Each round starts nbdkit with origin=, state= and control=, checks that
# the server came back with exactly the persistent snapshots the model
# expects (each one byte for byte as the origin was at its instant), that
# the origin is exactly the model, and then runs a writer on the origin
# while it creates, drops and merges run-time snapshots through
# snapfgctl, until it kills nbdkit with SIGKILL at a random moment
# (sometimes in the middle of a merge).
#
# The model: the origin's contents as a bytearray, updated by the writer
# after each acknowledged write.  The one write in flight when nbdkit is
# killed may or may not have landed: after the restart that range is read
# back and must be either the old or the new data (then the model takes
# what is there).  A snapshot's expected image is a copy of the model
# taken with the writer paused, just before "create"; a merge replaces
# the model with the merged snapshot's image at once (the origin view
# becomes the snapshot's view) and the writer carries on over it.
# Transient snapshots are created too and must be gone after a restart.
#
# --writeback on: the server runs with writeback=on, which acknowledges a
# first write before its data is on the origin and promises only the
# flushed writes across a kill -9.  The writer then flushes after about
# every 8th write and keeps a second model, of what the last completed
# flush covered; after the restart each 512-byte sector must hold that
# model's contents or one of the writes made to it since (then the model
# takes what is there).  A snapshot is created, and a merge started, right
# after a flush, so that its expected image is durable.  --writeback off
# (the default) checks every acknowledged write, as above.

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

from snapfg_test import log, connect_unix as connect

CHUNK = 4096


def fail(msg):
    print("lifecycle-loop: FAIL: %s" % msg, flush=True)
    sys.exit(1)


def read_export(sock, export, size):
    h = connect(sock, export)
    out = bytearray()
    step = 1 << 20
    for off in range(0, size, step):
        out += h.pread(min(step, size - off), off)
    h.shutdown()
    return out


class Writer(threading.Thread):
    """Random writes to the origin; model updated after each ack."""

    def __init__(self, sock, model, seed, flushing, durable):
        super().__init__(daemon=True)
        self.sock = sock
        self.model = model
        # With flushing (writeback=on): durable is the origin as the last
        # completed flush left it, and since_flush the writes made after
        # it (including the one in flight), oldest first.
        self.flushing = flushing
        self.durable = durable
        self.since_flush = []
        self.h = None
        self.rng = random.Random(seed)
        self.lock = threading.Lock()      # held around each write
        self.stop = False
        self.inflight = None              # (offset, old bytes, new bytes)
        self.writes = 0
        self.error = None

    def run(self):
        try:
            h = self.h = connect(self.sock, "origin")
        except Exception as e:              # server gone already
            self.error = e
            return
        size = len(self.model)
        while not self.stop:
            n = self.rng.choice([512, 4096, 8192, 65536])
            off = self.rng.randrange(0, (size - n) // 512 + 1) * 512
            data = self.rng.randbytes(n)
            with self.lock:
                if self.stop:
                    break
                self.inflight = (off, bytes(self.model[off:off + n]), data)
                if self.flushing:
                    self.since_flush.append((off, data))
                try:
                    h.pwrite(data, off)
                except Exception as e:      # nbdkit was killed
                    self.error = e
                    return
                self.model[off:off + n] = data
                self.inflight = None
                self.writes += 1
                if self.flushing and self.rng.random() < 0.125:
                    try:
                        self.flush_locked()
                    except Exception as e:
                        self.error = e
                        return
            time.sleep(0.001)
        try:
            h.shutdown()
        except Exception:
            pass

    def flush_locked(self):
        """A flush, with self.lock held: once it completes, every write
        so far is durable."""
        self.h.flush()
        self.durable[:] = self.model
        self.since_flush = []


def check_flushed(rnd, got, durable, since_flush):
    """After a kill -9 with writeback=on: every sector holds what the
    last completed flush left there or one of the writes made since."""
    allowed = {}                    # sector -> its versions since the flush
    for off, data in since_flush:
        for k in range(0, len(data), 512):
            allowed.setdefault((off + k) // 512, []).append(data[k:k + 512])
    if len(got) != len(durable):
        fail("round %d: the origin has %d bytes, expected %d"
             % (rnd, len(got), len(durable)))
    if got == durable:
        return 0
    n = 0
    for s in range(len(got) // 512):
        g = bytes(got[s * 512:(s + 1) * 512])
        if g == durable[s * 512:(s + 1) * 512]:
            continue
        if g not in allowed.get(s, []):
            fail("round %d: origin sector %d holds neither what the last "
                 "completed flush left there nor a write made since "
                 "(a flushed write lost?)" % (rnd, s))
        n += 1
    return n


class Server:
    def __init__(self, a, rnd):
        self.a = a
        self.sock = os.path.join(a.dir, "sock")
        self.ctl = os.path.join(a.dir, "ctl.sock")
        self.log = open(os.path.join(a.dir, "nbdkit-%d.log" % rnd), "w")
        for p in (self.sock, self.ctl):
            if os.path.exists(p):
                os.unlink(p)
        env = dict(os.environ)
        env["SNAPFG_TEST_MERGE_DELAY_US"] = "20000"
        self.proc = subprocess.Popen(
            ["nbdkit", "-f", "-U", self.sock, a.plugin,
             "origin=" + a.origin, "state=" + a.state,
             "control=" + self.ctl] +
            ["writeback=" + a.writeback],
            stderr=self.log, env=env)
        for _ in range(600):
            if os.path.exists(self.sock) and os.path.exists(self.ctl):
                return
            if self.proc.poll() is not None:
                fail("nbdkit exited with %s at start-up (round %d): see %s"
                     % (self.proc.returncode, rnd, self.log.name))
            time.sleep(0.1)
        fail("nbdkit did not start within 60 s")

    def ctl_cmd(self, *args, ok=True):
        r = subprocess.run([self.a.snapfgctl, "-S", self.ctl] + list(args),
                           capture_output=True, text=True, timeout=120)
        if ok and r.returncode != 0:
            fail("snapfgctl %s: exit %d: %s" % (" ".join(args), r.returncode,
                                                r.stderr.strip()))
        return r

    def status(self):
        r = self.ctl_cmd("--json", "list")
        return {s["name"]: s for s in json.loads(r.stdout)["snapshots"]}

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--plugin", required=True)
    p.add_argument("--snapfgctl", required=True)
    p.add_argument("--origin", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--writeback", default="off", choices=["on", "off"])
    a = p.parse_args()
    flushing = a.writeback == "on"

    rng = random.Random(a.seed)
    model = bytearray(open(a.origin, "rb").read())
    size = len(model)
    expected = {}       # persistent snapshot name -> expected image
    merging = None      # (name, image) of a merge that may be under way
    inflight = None
    since_flush = []
    durable = bytearray(model)
    serial = 0
    checked = 0

    for rnd in range(a.rounds):
        srv = Server(a, rnd)

        # --- after the restart: everything as the model says ---
        if flushing:
            got = read_export(srv.sock, "origin", size)
            n = check_flushed(rnd, got, durable, since_flush)
            log("round %d: every flushed write is on the origin; %d sectors "
                "hold unflushed writes" % (rnd, n))
            model[:] = got
            durable[:] = got
            since_flush = []
            inflight = None
        if inflight:
            off, old, new = inflight
            got = bytes(read_export(srv.sock, "origin", size)[off:off + len(new)])
            # A write that was never acknowledged promises nothing as a
            # whole: it may be split at chunk boundaries (and a merge
            # writes chunk by chunk), so part of it may have landed.  But
            # every 512-byte sector must be either its old or its new data.
            for k in range(0, len(new), 512):
                if got[k:k + 512] not in (old[k:k + 512], new[k:k + 512]):
                    fail("round %d: the write in flight at the kill (offset %d, "
                         "%d bytes): sector at +%d is neither old nor new data"
                         % (rnd, off, len(new), k))
            model[off:off + len(new)] = got
            inflight = None
        st = srv.status()
        if merging and merging[0] in st:
            # Resumed by itself before any client: wait until it is done.
            for _ in range(1200):
                st = srv.status()
                if merging[0] not in st:
                    break
                if st[merging[0]].get("state") != "merging":
                    fail("round %d: %s is back but not merging: %s"
                         % (rnd, merging[0], st[merging[0]]))
                time.sleep(0.1)
            else:
                fail("round %d: the resumed merge of %s did not finish"
                     % (rnd, merging[0]))
        if merging:
            log("round %d: merge of %s complete" % (rnd, merging[0]))
            merging = None
        names = set(st)
        if names != set(expected):
            fail("round %d: after the restart the server has snapshots %s, "
                 "expected %s (transient ones must be gone)"
                 % (rnd, sorted(names), sorted(expected)))
        for name, img in expected.items():
            if st[name]["state"] != "valid":
                fail("round %d: snapshot %s is %s after the restart"
                     % (rnd, name, st[name]["state"]))
            got = read_export(srv.sock, name, size)
            if got != img:
                diff = next(i for i in range(size) if got[i] != img[i])
                fail("round %d: snapshot %s differs from the origin at its "
                     "instant (first at byte %d)" % (rnd, name, diff))
            checked += 1
        got = read_export(srv.sock, "origin", size)
        if got != model:
            diff = next(i for i in range(size) if got[i] != model[i])
            fail("round %d: the origin differs from its model at byte %d "
                 "(an acknowledged write lost?)" % (rnd, diff))
        log("round %d: %d snapshots and the origin are byte for byte as "
            "expected" % (rnd, len(expected)))

        # --- a writer, and snapshot operations, until the kill ---
        w = Writer(srv.sock, model, a.seed * 1000 + rnd, flushing, durable)
        w.start()
        kill_after = rng.randint(2, 6)
        for step in range(kill_after):
            time.sleep(rng.uniform(0.05, 0.3))
            st = srv.status()
            busy = any(s["state"] == "merging" for s in st.values())
            op = rng.choice(["create", "create", "create-transient",
                             "drop", "merge"])
            if op.startswith("create") and not busy and len(st) < 4:
                serial += 1
                name = "s%d" % serial
                args = ["create", name]
                if op == "create-transient":
                    args += ["--store", "transient", "--cow",
                             os.path.join(a.dir, "%s.cow" % name)]
                elif rng.random() < 0.5:
                    args += ["--cow", os.path.join(a.dir, "%s.cow" % name)]
                with w.lock:            # the snapshot's instant: no write
                    if flushing and w.h:
                        w.flush_locked()
                    image = bytes(model)
                    srv.ctl_cmd(*args)
                if op == "create":
                    expected[name] = image
                log("round %d: created %s (%s)" % (rnd, name, " ".join(args[2:]) or "state dir"))
            elif op == "drop" and st and not busy:
                name = rng.choice(sorted(st))
                srv.ctl_cmd("drop", name)
                expected.pop(name, None)
                log("round %d: dropped %s" % (rnd, name))
            elif op == "merge" and len(st) == 1 and not busy:
                name = next(iter(st))
                if name not in expected:
                    continue            # a transient one cannot merge
                with w.lock:
                    if flushing and w.h:
                        w.flush_locked()
                    # From the reply on, the origin view is the snapshot's.
                    srv.ctl_cmd("merge", name)
                    model[:] = expected.pop(name)
                    if flushing:
                        durable[:] = model
                        w.since_flush = []
                merging = (name, None)
                log("round %d: merging %s" % (rnd, name))
        time.sleep(rng.uniform(0, 0.3))
        srv.kill()                      # a write may well be in flight
        w.stop = True
        w.join()
        inflight = w.inflight
        since_flush = w.since_flush
        log("round %d: killed nbdkit (SIGKILL) after %d origin writes%s"
            % (rnd, w.writes, " during a merge" if merging else ""))
        # Never a merge of a snapshot that is still in 'expected'.
        if merging and merging[0] in expected:
            fail("internal: merged snapshot still expected")

    log("ok: %d rounds, %d snapshot checks byte for byte" % (a.rounds, checked))


if __name__ == "__main__":
    main()
