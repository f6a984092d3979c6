# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# What the Python test helpers share (control-io.py, persistent-io.py,
# failures-io.py):
# connecting, error names, the region and chunk-list arguments, random
# requests and writes, a model of an export's contents, and the "read"
# command.
# Run the helpers with /usr/bin/python3 (the interpreter that has the nbd
# module); they find this module beside them.
#
# Output format, the same in every helper: results a test parses go to
# stdout ("ok ...", "errno NAME", "connect-failed MESSAGE"); messages go
# through log(), which prefixes the helper's name.

import os
import sys

import nbd

PROG = os.path.splitext(os.path.basename(sys.argv[0]))[0]


def log(msg, file=sys.stdout):
    """A message, prefixed with the helper's name ("control-io: ...")."""
    print("%s: %s" % (PROG, msg), file=file, flush=True)


def skip_part(msg):
    """A part of the test that did not run here (a premise not met): a
    SKIP-PART line, and a line in the shell test's list of skipped parts
    (tests/functions.sh skip_part), so that the test's summary counts it
    as skipped, never as passed."""
    log("SKIP-PART: %s" % msg)
    path = os.environ.get("SNAPFG_SKIPPED_PARTS")
    if path:
        with open(path, "a") as f:
            f.write("%s: %s\n" % (PROG, msg))


def connect(uri, strict_align=True):
    """A connected handle.  strict_align=False lets requests not aligned
    to the export's minimum block size through (to test refusals)."""
    h = nbd.NBD()
    if not strict_align:
        h.set_strict_mode(nbd.STRICT_MASK & ~nbd.STRICT_ALIGN)
    h.connect_uri(uri)
    return h


def connect_unix(sock, export, strict_align=True):
    """A handle connected to export on the Unix socket sock."""
    h = nbd.NBD()
    if not strict_align:
        h.set_strict_mode(nbd.STRICT_MASK & ~nbd.STRICT_ALIGN)
    h.set_export_name(export)
    h.connect_unix(sock)
    return h


def write_tracked(h, img, off, n):
    """Write n random bytes at off through h and into img, a bytearray
    of what the export must hold."""
    buf = os.urandom(n)
    h.pwrite(buf, off)
    img[off:off + n] = buf


def close(h):
    """Disconnect politely; a connection already gone is fine."""
    try:
        h.shutdown()
    except nbd.Error:
        pass


def errno_name(e):
    """An nbd.Error's errno name ("EIO"), or "none" if it has none."""
    return e.errno if e.errno is not None else "none"


def parse_region(s, size):
    """OFF:LEN (numbers in any base Python reads) or, if None, the whole
    export of the given size."""
    if s is None:
        return 0, size
    off, length = s.split(":")
    return int(off, 0), int(length, 0)


def parse_chunks(spec):
    """A chunk list "A,B,C-D" (ranges inclusive) as a list of numbers."""
    out = []
    for part in spec.split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def touched(offset, length, chunk_size):
    """The chunks a request of length bytes at offset touches."""
    return range(offset // chunk_size,
                 (offset + length - 1) // chunk_size + 1)


def random_request(rng, roff, rlen, max_len, align):
    """A random request inside [roff, roff + rlen): offset and length
    multiples of align, length at most max_len."""
    length = rng.randrange(1, max_len // align + 1) * align
    length = min(length, rlen)
    off = roff + rng.randrange(0, (rlen - length) // align + 1) * align
    return off, length


class Model:
    """The expected contents of an export, kept in memory (loaded from
    path, if given) and saved back to path by save()."""

    def __init__(self, path):
        self.path = path
        self.data = bytearray(open(path, "rb").read()) if path else None

    def write(self, off, data):
        if self.data is not None:
            self.data[off:off + len(data)] = data

    def save(self):
        if self.path:
            with open(self.path, "wb") as f:
                f.write(self.data)


def write_random(h, rng, model, off, length):
    """Write length random bytes (from rng) at off, and the same to the
    model; returns them."""
    data = rng.randbytes(length)
    h.pwrite(data, off)
    model.write(off, data)
    return data


def flush_close_save(h, model):
    """The end of a writer: flush, disconnect, save the model."""
    h.flush()
    close(h)
    model.save()


def cmd_read(a):
    """read URI OFFSET LEN: one read; prints "ok" or "errno NAME" (exit 0
    either way), or "connect-failed MESSAGE" (exit 2)."""
    try:
        h = connect(a.uri)
    except nbd.Error as e:
        print("connect-failed %s" % e.string)
        sys.exit(2)
    try:
        h.pread(a.length, a.offset)
        print("ok")
    except nbd.Error as e:
        print("errno %s" % errno_name(e))
    close(h)


def add_read_command(sub):
    """The "read" subcommand, for an argparse subparsers object."""
    s = sub.add_parser("read")
    s.add_argument("uri")
    s.add_argument("offset", type=int)
    s.add_argument("length", type=int)
    s.set_defaults(fn=cmd_read)
