#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The writer of test-backup-group.sh: a counter written to disk a and
# then to disk b, each write acknowledged before the next, until
# STOP-FILE exists:
#
#   group-writer.py URI_A URI_B STOP-FILE READY-FILE
#
# Each write is 4096 bytes at offset 0: the counter as 8 bytes little
# endian, then zeroes.  So at any instant b's counter is a's, or one
# less.  Prints the last counter written.

import os
import struct
import sys

import nbd

uri_a, uri_b, stop, ready = sys.argv[1:5]
a = nbd.NBD()
a.connect_uri(uri_a)
b = nbd.NBD()
b.connect_uri(uri_b)
n = 0
while not os.path.exists(stop):
    n += 1
    block = struct.pack("<Q", n) + bytes(4088)
    a.pwrite(block, 0)
    b.pwrite(block, 0)
    if n == 10:
        open(ready, "w").close()
a.flush()
b.flush()
a.shutdown()
b.shutdown()
print(n)
