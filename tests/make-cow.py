#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Build, check and damage COW stores in Linux dm-snapshot's persistent
# format, written from the layout in docs/design.md section 5 (not from any
# implementation):
#
#   chunk 0               header: le32 magic 0x70416e53 ("SnAp"), le32 valid,
#                         le32 version (1), le32 chunk size in 512-byte sectors
#   chunk 1 + (P+1)*i     metadata area i: P = chunk_size/16 pairs of
#                         (le64 old_chunk, le64 new_chunk); new_chunk 0 ends
#                         the table; each area is followed by the P data
#                         chunks it describes
#
# Subcommands:
#
#   build --origin F --chunk-size C --exceptions N --out COW --expected SNAP
#         [--seed S] [--extra-chunks K] [--valid V] [--include C,C,...]
#         [--exclude C,C,...]
#       A store with N exceptions for N random origin chunks, in the
#       order dm would have allocated them, each data chunk holding a
#       distinctive pattern; SNAP is what the snapshot must read (the
#       origin with those chunks replaced).  The file ends after the last
#       data chunk, plus the next metadata area if the last one used is
#       full, plus K chunks.  --include: origin chunks that must be among
#       the remapped ones; --exclude: origin chunks that must not be.
#
#   verify --cow COW --snapshot SNAP --chunk-size C --origin-size BYTES
#          [--expect-chunks FILE] [--expect-count N] [--dense]
#       Parse a store field by field and check it: the header; metadata
#       areas at their positions; every pair's new chunk a data chunk
#       inside the file whose contents equal SNAP's old chunk; no old
#       chunk or new chunk twice; the table ended by a zero pair; every
#       area zero after its last pair; every area after the last one (in
#       the file) all zero.  --expect-chunks: the set of old chunks must
#       equal the numbers in FILE.  --dense: the new chunks are exactly
#       the first N data chunks (no chunk lost or skipped).  Prints a
#       summary line; exits 1 listing the problems.
#
#   set-header COW [--magic M] [--valid V] [--version V] [--chunk-sectors S]
#   set-pair COW --chunk-size C --area A --index I [--old O] [--new N]
#   get-pair COW --chunk-size C --area A --index I
#       Change (or print) single fields in place.

import argparse
import random
import struct
import sys

MAGIC = 0x70416e53


def area_chunk(i, ppa):
    return 1 + (ppa + 1) * i


def is_metadata(chunk, ppa):
    return chunk == 0 or (chunk - 1) % (ppa + 1) == 0


def pattern(old, new, chunk_size, rng):
    head = b"snapfg test exception: old chunk %d -> new chunk %d\n" % (old, new)
    body = rng.randbytes(chunk_size - len(head))
    return head + body


def cmd_build(a):
    cs = a.chunk_size
    ppa = cs // 16
    rng = random.Random(a.seed)
    origin = open(a.origin, "rb").read()
    origin_chunks = (len(origin) + cs - 1) // cs
    if a.exceptions > origin_chunks:
        sys.exit("more exceptions than origin chunks")
    include = [int(x) for x in a.include.split(",")] if a.include else []
    exclude = set(int(x) for x in a.exclude.split(",")) if a.exclude else set()
    if exclude & set(include):
        sys.exit("--include and --exclude share chunks")
    olds = include + rng.sample([c for c in range(origin_chunks)
                                 if c not in include and c not in exclude],
                                a.exceptions - len(include))
    rng.shuffle(olds)

    snap = bytearray(origin)
    pairs = []
    data = {}
    new = 2
    for old in olds:
        while is_metadata(new, ppa):
            new += 1
        pairs.append((old, new))
        d = pattern(old, new, cs, rng)
        start = old * cs
        end = min(start + cs, len(origin))
        if end - start < cs:        # the last, partial chunk: zero tail
            d = d[:end - start] + bytes(cs - (end - start))
        data[new] = d
        snap[start:end] = d[:end - start]
        new += 1

    nareas = len(pairs) // ppa + 1     # the last one holds the terminator
    last_chunk = max([area_chunk(nareas - 1, ppa)] + list(data))
    nchunks = last_chunk + 1 + a.extra_chunks
    buf = bytearray(nchunks * cs)
    struct.pack_into("<IIII", buf, 0, MAGIC, a.valid, 1, cs // 512)
    for k, (old, new) in enumerate(pairs):
        area, idx = divmod(k, ppa)
        struct.pack_into("<QQ", buf, area_chunk(area, ppa) * cs + idx * 16,
                         old, new)
    for new, d in data.items():
        buf[new * cs:(new + 1) * cs] = d
    open(a.out, "wb").write(buf)
    open(a.expected, "wb").write(snap)
    print("built %s: %d exceptions, %d metadata areas, %d chunks of %d bytes"
          % (a.out, len(pairs), nareas, nchunks, cs))


def cmd_verify(a):
    cs = a.chunk_size
    ppa = cs // 16
    cow = open(a.cow, "rb").read()
    snap = open(a.snapshot, "rb").read()
    origin_chunks = (a.origin_size + cs - 1) // cs
    file_chunks = len(cow) // cs
    problems = []

    def problem(msg):
        problems.append(msg)

    if len(cow) < 16:
        sys.exit("%s: too short for a header" % a.cow)
    magic, valid, version, sectors = struct.unpack_from("<IIII", cow, 0)
    if magic != MAGIC:
        problem("header magic 0x%08x, expected 0x%08x" % (magic, MAGIC))
    if valid != 1:
        problem("header valid %d, expected 1" % valid)
    if version != 1:
        problem("header version %d, expected 1" % version)
    if sectors * 512 != cs:
        problem("header chunk size %d sectors, expected %d" % (sectors, cs // 512))
    if len(cow) % cs:
        problem("file size %d is not a multiple of the chunk size" % len(cow))

    olds, news = {}, set()
    current, current_used = None, 0
    area = 0
    while True:
        loc = area_chunk(area, ppa)
        if loc >= file_chunks:
            problem("metadata area %d (chunk %d) is past the end of the file "
                    "(%d chunks)" % (area, loc, file_chunks))
            break
        base = loc * cs
        used = ppa
        for i in range(ppa):
            old, new = struct.unpack_from("<QQ", cow, base + i * 16)
            if new == 0:
                used = i
                break
            where = "area %d pair %d (%d -> %d)" % (area, i, old, new)
            if new >= file_chunks:
                problem("%s: new chunk past the end of the file" % where)
                continue
            if is_metadata(new, ppa):
                problem("%s: new chunk is a metadata chunk" % where)
            if new in news:
                problem("%s: new chunk used twice" % where)
            news.add(new)
            if old >= origin_chunks:
                problem("%s: old chunk past the end of the origin" % where)
                continue
            if old in olds:
                problem("%s: old chunk already remapped (%s)" % (where, olds[old]))
            olds[old] = where
            want = snap[old * cs:(old + 1) * cs]
            got = cow[new * cs:new * cs + len(want)]
            if got != want:
                problem("%s: data chunk differs from the snapshot's chunk %d"
                        % (where, old))
            # (The tail of a partial last chunk, past the origin's end, is
            # never read: its contents are not checked.)
        if used < ppa:
            rest = cow[base + used * 16:base + cs]
            if any(rest):
                problem("metadata area %d: not zero after its last pair "
                        "(pair %d) -- the kernel would read stale pairs"
                        % (area, used))
            current, current_used = area, used
            break
        area += 1

    if current is None:             # the table ran past the end of the file
        current = area
    # Every metadata area after the current one that the file holds must
    # be all zero.
    a2 = current + 1
    while area_chunk(a2, ppa) < file_chunks:
        loc = area_chunk(a2, ppa)
        if any(cow[loc * cs:(loc + 1) * cs]):
            problem("metadata area %d (chunk %d), after the last one in use "
                    "(%d), is not zero" % (a2, loc, current))
        a2 += 1

    n = len(olds)
    if a.expect_count is not None and n != a.expect_count:
        problem("%d exceptions, expected %d" % (n, a.expect_count))
    if a.expect_chunks:
        want = {int(l) for l in open(a.expect_chunks) if l.strip()}
        if want != set(olds):
            problem("the exceptions remap %d chunks, expected %d; missing %s, "
                    "extra %s" % (len(olds), len(want),
                                  sorted(want - set(olds))[:10],
                                  sorted(set(olds) - want)[:10]))
    next_free = max(news) + 1 if news else 2
    while is_metadata(next_free, ppa):
        next_free += 1
    if a.dense:
        dense, c = set(), 2
        while len(dense) < len(news):
            if not is_metadata(c, ppa):
                dense.add(c)
            c += 1
        if dense != news:
            problem("new chunks are not the first %d data chunks: unused %s"
                    % (len(news), sorted(dense - news)[:10]))
    spc = cs // 512
    print("%s: %d exceptions, current area %d with %d pairs, next free chunk %d, "
          "status %d/%d %d" % (a.cow, n, current, current_used, next_free,
                               next_free * spc, file_chunks * spc,
                               (current + 2) * spc))
    if problems:
        for p in problems[:30]:
            print("PROBLEM: " + p, file=sys.stderr)
        if len(problems) > 30:
            print("PROBLEM: ... and %d more" % (len(problems) - 30), file=sys.stderr)
        sys.exit(1)


def cmd_set_header(a):
    with open(a.cow, "r+b") as f:
        h = list(struct.unpack("<IIII", f.read(16)))
        for i, v in enumerate((a.magic, a.valid, a.version, a.chunk_sectors)):
            if v is not None:
                h[i] = v
        f.seek(0)
        f.write(struct.pack("<IIII", *h))


def pair_offset(a):
    ppa = a.chunk_size // 16
    return area_chunk(a.area, ppa) * a.chunk_size + a.index * 16


def cmd_set_pair(a):
    with open(a.cow, "r+b") as f:
        f.seek(pair_offset(a))
        old, new = struct.unpack("<QQ", f.read(16))
        if a.old is not None:
            old = a.old
        if a.new is not None:
            new = a.new
        f.seek(pair_offset(a))
        f.write(struct.pack("<QQ", old, new))


def cmd_get_pair(a):
    with open(a.cow, "rb") as f:
        f.seek(pair_offset(a))
        print("%d %d" % struct.unpack("<QQ", f.read(16)))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    num = lambda s: int(s, 0)

    s = sub.add_parser("build")
    s.add_argument("--origin", required=True)
    s.add_argument("--chunk-size", type=num, required=True)
    s.add_argument("--exceptions", type=num, required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--expected", required=True)
    s.add_argument("--seed", type=num, default=1)
    s.add_argument("--extra-chunks", type=num, default=0)
    s.add_argument("--valid", type=num, default=1)
    s.add_argument("--include")
    s.add_argument("--exclude")
    s.set_defaults(fn=cmd_build)

    s = sub.add_parser("verify")
    s.add_argument("--cow", required=True)
    s.add_argument("--snapshot", required=True)
    s.add_argument("--chunk-size", type=num, required=True)
    s.add_argument("--origin-size", type=num, required=True)
    s.add_argument("--expect-chunks")
    s.add_argument("--expect-count", type=num)
    s.add_argument("--dense", action="store_true")
    s.set_defaults(fn=cmd_verify)

    s = sub.add_parser("set-header")
    s.add_argument("cow")
    s.add_argument("--magic", type=num)
    s.add_argument("--valid", type=num)
    s.add_argument("--version", type=num)
    s.add_argument("--chunk-sectors", type=num)
    s.set_defaults(fn=cmd_set_header)

    for name, fn in (("set-pair", cmd_set_pair), ("get-pair", cmd_get_pair)):
        s = sub.add_parser(name)
        s.add_argument("cow")
        s.add_argument("--chunk-size", type=num, required=True)
        s.add_argument("--area", type=num, required=True)
        s.add_argument("--index", type=num, required=True)
        if name == "set-pair":
            s.add_argument("--old", type=num)
            s.add_argument("--new", type=num)
        s.set_defaults(fn=fn)

    a = p.parse_args()
    a.fn(a)


if __name__ == "__main__":
    main()
