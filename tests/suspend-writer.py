#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# One write for test-suspend.sh: connects to URI, writes LEN bytes of
# BYTE at OFFSET, and then creates DONE-FILE (holding the seconds the
# write took).  Connecting first, then creating READY-FILE, lets the
# test know the write is on its way.
#
#   suspend-writer.py URI OFFSET LEN BYTE READY-FILE DONE-FILE

import sys
import time

import nbd

uri, offset, length, byte, ready, done = sys.argv[1:7]
h = nbd.NBD()
h.connect_uri(uri)
open(ready, "w").close()
t0 = time.monotonic()
h.pwrite(bytes([int(byte, 0)]) * int(length), int(offset))
took = time.monotonic() - t0
h.flush()
h.shutdown()
with open(done + ".tmp", "w") as f:
    f.write("%.3f\n" % took)
import os
os.rename(done + ".tmp", done)
