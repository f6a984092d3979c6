#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
"""The mutations of tests/test-state-mutation.sh: damaged or tampered
state files, one case per row of CASES.

  state-mutation.py cases                 one line per case: NAME EXPECT
  state-mutation.py apply NAME WORK       apply case NAME to WORK's files
  state-mutation.py verify SOCK WORK EXPORTS MARKER
                                          (run by nbdkit --run) the server
                                          on SOCK serves exactly EXPORTS
                                          (comma-separated; "-": none
                                          but the origin), each byte for
                                          byte as WORK/expect/NAME.img

WORK holds the state the test set up (see the test): st/cat.json, its
state directory st/cat.json.d/ (s1.cow, c1.cbt, c2.cbt), st/s2.cow and
st/s3.cow, and another server's state in stB/ (catB.json, catB.json.d/
x1.cow: another origin).

EXPECT is "serve:EXPORTS" (the server must start and serve exactly
those snapshots, byte for byte), "serve:EXPORTS;inconsistent=C1,C2"
(the same, and afterwards the catalogue records exactly checkpoints C1,
C2 as inconsistent, so that the next backup is a full one) or
"refuse:TEXT" (the start must fail with TEXT in its message and every
file exactly as it was).

To add a case, add a row to CASES: a name, the expected outcome and a
function of a Work that mutates the files (w.cat is the catalogue as a
dict; w.save() writes it back).
"""

import json
import os
import shutil
import sys

ALL = "s1,s2,s3"


class Work:
    def __init__(self, root):
        self.root = root
        self.st = os.path.join(root, "st")
        self.path = os.path.join(self.st, "cat.json")
        self.sd = self.path + ".d"
        self.stb = os.path.join(root, "stB")
        with open(self.path) as f:
            self.cat = json.load(f)

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self.cat, f, indent=2)

    def snap(self, name):
        for s in self.cat["snapshots"]:
            if s["name"] == name:
                return s
        raise KeyError(name)

    def ckpt(self, name):
        for c in self.cat["checkpoints"]:
            if c["name"] == name:
                return c
        raise KeyError(name)

    def set(self, name, field, value):
        self.snap(name)[field] = value
        self.save()

    def set_ckpt(self, name, field, value):
        self.ckpt(name)[field] = value
        self.save()

    def swap(self, a, b, field):
        sa, sb = self.snap(a), self.snap(b)
        sa[field], sb[field] = sb[field], sa[field]
        self.save()

    def write_text(self, text):
        with open(self.path, "w") as f:
            f.write(text)

    def swap_files(self, a, b):
        tmp = a + ".swap"
        os.rename(a, tmp)
        os.rename(b, a)
        os.rename(tmp, b)


def truncate(w, fraction):
    with open(w.path) as f:
        text = f.read()
    w.write_text(text[:int(len(text) * fraction)])


def missing_catalogue(w):
    os.unlink(w.path)


def state_dir_symlink_store(w):
    os.unlink(os.path.join(w.sd, "s1.cow"))
    os.symlink(os.path.join(w.st, "s2.cow"), os.path.join(w.sd, "s1.cow"))


def bitmap_symlink(w):
    # The bitmap's contents, but behind a link to a file outside.
    outside = os.path.join(w.root, "outside.cbt")
    shutil.copyfile(os.path.join(w.sd, "c2.cbt"), outside)
    os.unlink(os.path.join(w.sd, "c2.cbt"))
    os.symlink(outside, os.path.join(w.sd, "c2.cbt"))


def catalogue_symlink(w):
    os.rename(w.path, w.path + ".real")
    os.symlink(w.path + ".real", w.path)


def bitmap_missing_and_store_missing(w):
    # The start fails at the store; the bitmap it found missing first
    # must not be recorded as inconsistent by that failed start.
    os.unlink(os.path.join(w.sd, "c2.cbt"))
    os.unlink(os.path.join(w.st, "s3.cow"))


def other_server_store(w):
    shutil.copyfile(os.path.join(w.stb, "catB.json.d", "x1.cow"),
                    os.path.join(w.sd, "s1.cow"))


def other_server_catalogue(w):
    shutil.copyfile(os.path.join(w.stb, "catB.json"), w.path)


def reorder(w):
    w.cat["snapshots"].reverse()
    w.cat["checkpoints"].reverse()
    w.save()


def duplicate_record(w):
    w.cat["snapshots"].append(dict(w.snap("s2")))
    w.save()


def duplicate_json_key(w):
    with open(w.path) as f:
        text = f.read()
    w.write_text(text.replace('"format"', '"id": "x", "format"', 1))


CASES = [
    # name, expected, mutation
    ("unchanged", "serve:" + ALL, lambda w: None),
    ("records-reordered", "serve:" + ALL, reorder),
    # types and values of every field
    ("store-bogus", 'refuse:field "store"', lambda w: w.set("s2", "store", "bogus")),
    ("store-number", 'refuse:field "store"', lambda w: w.set("s1", "store", 7)),
    ("chunk-size-string", 'refuse:field "chunk_size"', lambda w: w.set("s2", "chunk_size", "65536")),
    ("chunk-size-odd", 'refuse:field "chunk_size"', lambda w: w.set("s2", "chunk_size", 3000)),
    ("cow-size-negative", 'refuse:field "cow_size"', lambda w: w.set("s2", "cow_size", -1)),
    ("created-float", 'refuse:field "created"', lambda w: w.set("s3", "created", 1.5)),
    ("uuid-not-hex", 'refuse:field "uuid"', lambda w: w.set("s2", "uuid", "x" * 36)),
    ("uuid-missing", 'refuse:field "uuid"', lambda w: w.snap("s3").pop("uuid") and w.save()),
    ("state-unknown", 'refuse:field "state"', lambda w: w.set("s1", "state", "frozen")),
    ("owned-string", 'refuse:field "owned"', lambda w: w.set("s1", "owned", "yes")),
    ("owned-outside-state-dir", 'refuse:field "cow"', lambda w: w.set("s2", "owned", True)),
    ("name-empty", 'refuse:field "name"', lambda w: w.set("s2", "name", "")),
    ("name-number", 'refuse:field "name"', lambda w: w.set("s3", "name", 5)),
    ("cow-relative", 'refuse:field "cow"', lambda w: w.set("s2", "cow", "s2.cow")),
    ("cow-nul", "refuse:not a snapfg catalogue", lambda w: w.set("s2", "cow", w.snap("s2")["cow"] + "\u0000x")),
    ("cow-is-catalogue", 'refuse:is the catalogue', lambda w: w.set("s2", "cow", w.path)),
    ("cow-is-catalogue-tmp", "refuse:temporary file", lambda w: w.set("s2", "cow", w.path + ".tmp")),
    ("cow-in-state-dir", "refuse:in the state directory",
     lambda w: w.set("s2", "cow", os.path.join(w.sd, "c1.cbt"))),
    ("snapshots-not-array", 'refuse:"snapshots" is not an array',
     lambda w: w.cat.update(snapshots={}) or w.save()),
    ("checkpoint-bitmap-elsewhere", 'refuse:field "bitmap"',
     lambda w: w.set_ckpt("c1", "bitmap", os.path.join(w.st, "s2.cow"))),
    ("checkpoint-state-unknown", 'refuse:field "state"', lambda w: w.set_ckpt("c2", "state", "bogus")),
    ("checkpoint-seq-string", 'refuse:field "seq"', lambda w: w.set_ckpt("c1", "seq", "1")),
    ("checkpoint-granularity-odd", 'refuse:field "granularity"', lambda w: w.set_ckpt("c1", "granularity", 1000)),
    ("checkpoint-snapshot-number", 'refuse:field "snapshot"', lambda w: w.set_ckpt("c2", "snapshot", 3)),
    # duplicates
    ("duplicate-record", "refuse:a second record", duplicate_record),
    ("duplicate-name", "refuse:a second record", lambda w: w.set("s3", "name", "s2")),
    ("duplicate-uuid", "refuse:uuid of an earlier", lambda w: w.set("s3", "uuid", w.snap("s2")["uuid"])),
    ("duplicate-cow", "refuse:store of an earlier", lambda w: w.set("s3", "cow", w.snap("s2")["cow"])),
    ("duplicate-checkpoint-name", "refuse:a second record",
     lambda w: w.ckpt("c2").update(name="c1", bitmap=w.ckpt("c1")["bitmap"]) or w.save()),
    ("duplicate-json-key", "refuse:not a snapfg catalogue", duplicate_json_key),
    # swapped fields
    ("swapped-names", 'refuse:the store holds snapshot "s2"', lambda w: w.swap("s2", "s3", "name")),
    ("swapped-names-owned", 'refuse:field "cow"', lambda w: w.swap("s1", "s2", "name")),
    ("swapped-uuids", "refuse:not the store the catalogue recorded", lambda w: w.swap("s2", "s3", "uuid")),
    ("swapped-cows", "refuse:not the store the catalogue recorded", lambda w: w.swap("s2", "s3", "cow")),
    # truncation, emptiness
    ("empty", "refuse:is empty (0 bytes)", lambda w: w.write_text("")),
    ("truncated-half", "refuse:truncated", lambda w: truncate(w, 0.5)),
    ("truncated-tail", "refuse:truncated", lambda w: truncate(w, 0.98)),
    ("missing-catalogue", "serve:-", missing_catalogue),
    # checkpoint bitmaps (more: the bitmaps' own binding to their
    # checkpoint, catalogue and origin)
    ("bitmap-missing", "serve:" + ALL + ";inconsistent=c2",
     lambda w: os.unlink(os.path.join(w.sd, "c2.cbt"))),
    ("bitmap-truncated", "serve:" + ALL + ";inconsistent=c1",
     lambda w: os.truncate(os.path.join(w.sd, "c1.cbt"), 100)),
    # files swapped between records or servers, or gone
    ("swapped-store-files", "refuse:not the store the catalogue recorded",
     lambda w: w.swap_files(os.path.join(w.st, "s2.cow"), os.path.join(w.st, "s3.cow"))),
    ("store-of-another-server", "refuse:another origin", other_server_store),
    ("catalogue-of-another-server", "refuse:belongs to origin", other_server_catalogue),
    ("state-dir-missing", "refuse:is missing",
     lambda w: os.rename(w.sd, os.path.join(w.root, "elsewhere.d"))),
    ("bitmap-and-store-missing", "refuse:cannot open the COW", bitmap_missing_and_store_missing),
    # files and directories the server must not trust
    ("store-symlink", "refuse:symbolic link", state_dir_symlink_store),
    ("catalogue-symlink", "refuse:symbolic link", catalogue_symlink),
    ("state-dir-writable", "refuse:chmod go-w", lambda w: os.chmod(w.sd, 0o777)),
    ("catalogue-writable", "refuse:chmod go-w", lambda w: os.chmod(w.path, 0o666)),
    ("store-group-writable", "refuse:chmod go-w",
     lambda w: os.chmod(os.path.join(w.sd, "s1.cow"), 0o620)),
    ("bitmap-writable", "refuse:chmod go-w",
     lambda w: os.chmod(os.path.join(w.sd, "c1.cbt"), 0o666)),
    ("bitmap-symlink", "refuse:symbolic link", bitmap_symlink),
    ("bitmap-other-owner", "refuse:chown",
     lambda w: os.chown(os.path.join(w.sd, "c2.cbt"), 65534, -1)),
    ("catalogue-other-owner", "refuse:chown", lambda w: os.chown(w.path, 65534, -1)),
    ("state-dir-other-owner", "refuse:chown", lambda w: os.chown(w.sd, 65534, -1)),
    ("store-other-owner", "refuse:chown",
     lambda w: os.chown(os.path.join(w.sd, "s1.cow"), 65534, -1)),
]

NEEDS_ROOT = {"bitmap-other-owner", "catalogue-other-owner", "state-dir-other-owner",
              "store-other-owner"}


def verify(sock, root, exports, marker):
    import nbd
    open(marker, "w").close()
    want = [] if exports == "-" else exports.split(",")
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.connect_unix(sock)
    names = []
    h.opt_list(lambda name, desc: names.append(name) or 0)
    h.opt_abort()
    got = sorted(n for n in names if n not in ("", "origin"))
    ok = True
    if got != sorted(want):
        print("exports %s, expected %s" % (got, sorted(want)), file=sys.stderr)
        ok = False
    for name in ["origin"] + [n for n in want if n in got]:
        with open(os.path.join(root, "expect", name + ".img"), "rb") as f:
            expected = f.read()
        h = nbd.NBD()
        h.set_export_name(name)
        h.connect_unix(sock)
        size = h.get_size()
        data = bytearray()
        step = 1 << 20
        for off in range(0, size, step):
            data += h.pread(min(step, size - off), off)
        h.shutdown()
        if bytes(data) != expected:
            print("export %s: its data differ from what it must serve"
                  % name, file=sys.stderr)
            ok = False
    return 0 if ok else 1


def main():
    if sys.argv[1] == "cases":
        root = os.geteuid() == 0
        for name, expect, _ in CASES:
            if name in NEEDS_ROOT and not root:
                continue
            print(name, expect.replace(" ", "\x1f"))
        return 0
    if sys.argv[1] == "apply":
        for name, _, fn in CASES:
            if name == sys.argv[2]:
                fn(Work(sys.argv[3]))
                return 0
        sys.exit("no case %s" % sys.argv[2])
    if sys.argv[1] == "verify":
        return verify(*sys.argv[2:6])
    sys.exit("usage: state-mutation.py cases|apply|verify ...")


if __name__ == "__main__":
    sys.exit(main())
