#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
"""Read and damage write-back's held file for tests/test-held-file-bad.sh
(the layout is src/writeback/held-record.h's; this is an independent
reading of it).

  held-file.py info FILE             header fields, the mark, the records
  held-file.py header-byte FILE OFF  flip a header byte (checksum left)
  held-file.py record FILE N FIELD VALUE
                                     set record N's (from 0, in sequence
                                     order after the mark) FIELD (count,
                                     offset, seq, crc) and fix its
                                     checksum, unless FIELD is crc
  held-file.py data-byte FILE N      flip a byte of record N's data
  held-file.py origin-path FILE PATH set the header's origin path and
                                     fix the header checksum
"""

import struct
import sys

HEADER_FIXED = 1136
UUID_LEN = 40
PAGE = 4096
RECORD = 64


def crc32c(data, crc=0):
    crc ^= 0xffffffff
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82f63b78 & -(crc & 1))
    return crc ^ 0xffffffff


def layout(buf):
    slots, max_stores = struct.unpack_from("<II", buf, 96)
    header_len = struct.unpack_from("<Q", buf, 104)[0]
    mark_off = header_len
    ring_off = mark_off + PAGE
    mib = 1024 * 1024
    data_off = (ring_off + slots * RECORD + mib - 1) // mib * mib
    return slots, header_len, mark_off, ring_off, data_off


def records(buf):
    slots, header_len, mark_off, ring_off, _ = layout(buf)
    mark = struct.unpack_from("<Q", buf, mark_off)[0]
    out = []
    seq = mark + 1
    while seq - mark <= slots:
        at = ring_off + ((seq - 1) % slots) * RECORD
        rec = buf[at:at + RECORD]
        if rec[:4] != b"HWR1" or struct.unpack_from("<Q", rec, 8)[0] != seq:
            break
        out.append(at)
        seq += 1
    return mark, out


def fix_header_crc(buf):
    header_len = struct.unpack_from("<Q", buf, 104)[0]
    struct.pack_into("<I", buf, 12, 0)
    struct.pack_into("<I", buf, 12, crc32c(bytes(buf[:header_len])))


def fix_record_crc(buf, at):
    struct.pack_into("<I", buf, at + 4, 0)
    struct.pack_into("<I", buf, at + 4, crc32c(bytes(buf[at:at + RECORD])))


def main():
    cmd, path = sys.argv[1], sys.argv[2]
    f = open(path, "r+b")
    # The header, mark and ring (the data is read and written in place).
    head = bytearray(f.read(HEADER_FIXED))
    _, _, _, ring_off, data_off = layout(head)
    f.seek(0)
    buf = bytearray(f.read(data_off))
    mark, recs = records(buf)
    if cmd == "info":
        print("origin %s" % buf[112:112 + 1024].split(b"\0")[0].decode())
        print("boot %s" % buf[32:72].split(b"\0")[0].decode())
        print("stores %d" % struct.unpack_from("<I", buf, 28)[0])
        print("mark %d" % mark)
        print("records %d" % len(recs))
        return
    if cmd == "header-byte":
        buf[int(sys.argv[3])] ^= 0xff
    elif cmd == "origin-path":
        p = sys.argv[3].encode()
        buf[112:112 + 1024] = p + bytes(1024 - len(p))
        fix_header_crc(buf)
    elif cmd == "record":
        at = recs[int(sys.argv[3])]
        field, value = sys.argv[4], int(sys.argv[5], 0)
        fmt, off = {"seq": ("<Q", 8), "offset": ("<Q", 16),
                    "count": ("<I", 32), "crc": ("<I", 4)}[field]
        struct.pack_into(fmt, buf, at + off, value)
        if field != "crc":
            fix_record_crc(buf, at)
    elif cmd == "data-byte":
        at = recs[int(sys.argv[3])]
        doff = struct.unpack_from("<Q", buf, at + 24)[0]
        f.seek(doff)
        b = bytearray(f.read(1))
        b[0] ^= 0xff
        f.seek(doff)
        f.write(b)
    else:
        sys.exit("unknown command %s" % cmd)
    f.seek(0)
    f.write(buf)
    f.close()


if __name__ == "__main__":
    main()
