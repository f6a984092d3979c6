# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Helpers for the tests of backups of several disks at one instant
# (test-backup-group.sh into qcow2 chains, test-repo-group.sh into a
# repository), with tests/group-writer.py writing a counter to disk a,
# then to disk b:
#
#   source "$(dirname "$0")/group-functions.sh"   (after backup-functions.sh)
#
#   GROUP_WRITER              tests/group-writer.py
#   counter FILE              the counter at offset 0 of FILE
#   expect_disk FILE ORIG N WHAT
#                             FILE is ORIG with counter N's block at 0
#                             (N 0: ORIG itself); check_fail if not
#   stat_of CTL EXPR          EXPR (Python, on d) of the origin's stats
#   is_suspended CTL          the server holds writes now

# shellcheck shell=bash
GROUP_WRITER="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/group-writer.py"

counter() {
    "$PY" -c 'import struct, sys; print(struct.unpack("<Q", open(sys.argv[1], "rb").read(8))[0])' "$1"
}

expect_disk() {
    "$PY" - "$1" "$2" "$3" <<'PYEOF' && info "ok: $4" || check_fail "$4: not the origin at its instant"
import struct, sys
got = open(sys.argv[1], "rb").read()
want = bytearray(open(sys.argv[2], "rb").read())
n = int(sys.argv[3])
if n:
    want[0:4096] = struct.pack("<Q", n) + bytes(4088)
sys.exit(0 if got == bytes(want) else 1)
PYEOF
}

stat_of() {
    "$SNAPFGCTL" -S "$1" --json stats >"$tmpdir/stats.json"
    "$PY" -c '
import json, sys
d = [x for x in json.load(open(sys.argv[1]))["exports"] if x["export"] == "origin"][0]
print(eval(sys.argv[2]))' "$tmpdir/stats.json" "$2"
}

is_suspended() { [ "$(stat_of "$1" 'd["suspended"]')" = True ]; }
