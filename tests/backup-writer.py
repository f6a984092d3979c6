#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# A writer that keeps writing an NBD export (the origin) for the
# snapfg-backup tests, and can be quiesced between writes:
#
#   backup-writer.py URI CTLDIR SIZE SEED
#
# Each write is random data (4K to 64K at a 4K-aligned offset) or, one
# time in eight, write-zeroes of a whole 64K granule; every write is
# synchronous, so when the writer says it is paused nothing is in flight.
# Control files in CTLDIR:
#   pause   the writer finishes its write, creates "paused" and waits
#           until "pause" is removed, then starts a new phase
#   stop    the writer exits
# CTLDIR/writes.log gets one line per acknowledged write:
#   PHASE OFFSET LENGTH data|zero
# (phase 0 before the first pause, N after the Nth resume).

import os
import random
import sys
import time

import nbd

uri, ctldir, size, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
h = nbd.NBD()
h.connect_uri(uri)
assert h.get_size() == size, "origin size %d, expected %d" % (h.get_size(), size)

log = open(os.path.join(ctldir, "writes.log"), "a", buffering=1)
phase = 0
pause = os.path.join(ctldir, "pause")
paused = os.path.join(ctldir, "paused")
stop = os.path.join(ctldir, "stop")

while not os.path.exists(stop):
    if os.path.exists(pause):
        with open(paused + ".tmp", "w") as f:
            f.write("%d\n" % phase)
        os.rename(paused + ".tmp", paused)
        while os.path.exists(pause) and not os.path.exists(stop):
            time.sleep(0.01)
        os.unlink(paused)
        phase += 1
        continue
    if rng.randrange(8) == 0:
        off = rng.randrange(size // 65536) * 65536
        h.zero(65536, off)
        log.write("%d %d %d zero\n" % (phase, off, 65536))
    else:
        length = rng.randrange(1, 17) * 4096
        off = rng.randrange((size - length) // 4096 + 1) * 4096
        h.pwrite(os.urandom(length), off)
        log.write("%d %d %d data\n" % (phase, off, length))
    time.sleep(0.002)

h.flush()
h.shutdown()
