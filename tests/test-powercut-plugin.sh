#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The power-cut test plugin itself (tests/nbdkit-powercut-plugin.c),
# before the rounds of test-powercut.sh rely on it.  Two exports (origin,
# cow) of one nbdkit, two connections:
#  1. Reads see unflushed writes at once.  After the trigger file
#     appears, every request on every export and connection fails with
#     EIO, and the report names the seed.
#  2. On the images: a flushed write and a FUA write are there; a
#     flush on the second connection made the cow export's earlier
#     writes on the first durable (one cache per export), but not the
#     origin's; a 64 KiB write without flush survived sector by sector
#     (some sectors new, some old, none anything else); a sector written
#     three times holds one of its four versions.
#  3. The same run with the same seed leaves the same images.
#  4. cut-after=5: five requests are served, the sixth fails with EIO.
#  5. Restarted on the surviving images: reads give the images.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
source "$(dirname "$0")/powercut-functions.sh"
require_powercut
test_seed

dsock="$tmpdir/disks.sock"
size=$((1024 * 1024))

cat >"$tmpdir/scenario.py" <<'EOF'
import sys
import nbd
from snapfg_test import connect_unix, close

sock, trigger = sys.argv[1], sys.argv[2]
o1 = connect_unix(sock, "origin")
c1 = connect_unix(sock, "cow")
c2 = connect_unix(sock, "cow")
assert o1.can_multi_conn() and o1.can_fua() and o1.can_flush()

o1.pwrite(b"\x11" * 65536, 0)
o1.flush()
o1.pwrite(b"\x22" * 65536, 65536)          # never flushed
o1.pwrite(b"\x33" * 4096, 262144, nbd.CMD_FLAG_FUA)
for b in (0x44, 0x55, 0x66):                 # sector 1024, three versions
    o1.pwrite(bytes([b]) * 512, 1024 * 512)
c1.pwrite(b"\x77" * 65536, 0)
c2.flush()                                   # covers c1's write
c1.pwrite(b"\x99" * 65536, 131072)           # never flushed
# Read-your-writes across connections of one export.
assert c2.pread(65536, 131072) == b"\x99" * 65536
assert o1.pread(65536, 65536) == b"\x22" * 65536
assert o1.pread(512, 1024 * 512) == b"\x66" * 512

open(trigger, "w").close()
import time
for h, what in ((o1, "origin"), (c1, "cow 1"), (c2, "cow 2")):
    for _ in range(200):
        try:
            h.pread(512, 0)
            time.sleep(0.01)
        except nbd.Error as e:
            if e.errnum != 5:
                sys.exit("%s: failed with %s, expected EIO" % (what, e))
            break
    else:
        sys.exit("%s: reads still work 2 s after the trigger" % what)
for op, what in ((lambda: o1.pwrite(b"x" * 512, 0), "write"),
                 (lambda: c2.flush(), "flush"),
                 (lambda: o1.zero(512, 0), "zero")):
    try:
        op()
        sys.exit("%s after the cut succeeded" % what)
    except nbd.Error as e:
        if e.errnum != 5:
            sys.exit("%s after the cut: %s, expected EIO" % (what, e))
h = connect_unix(sock, "origin")             # a new connection too
try:
    h.pread(512, 0)
    sys.exit("a read on a new connection after the cut succeeded")
except nbd.Error:
    pass
for x in (o1, c1, c2, h):
    close(x)
print("scenario: ok")
EOF

cat >"$tmpdir/verify.py" <<'EOF'
import sys
o = open(sys.argv[1], "rb").read()
c = open(sys.argv[2], "rb").read()
S = 512
def sectors(img, off, n):
    return [img[off + i * S:off + (i + 1) * S] for i in range(n)]
bad = []
if o[:65536] != b"\x11" * 65536: bad.append("the flushed origin write is missing")
if o[262144:266240] != b"\x33" * 4096: bad.append("the FUA write is missing")
if c[:65536] != b"\x77" * 65536: bad.append("the cow write covered by the flush on the other connection is missing")
def mixed(img, off, byte, what):
    ss = sectors(img, off, 128)
    new = sum(s == bytes([byte]) * S for s in ss)
    old = sum(s == bytes(S) for s in ss)
    if new + old != 128: bad.append("%s: %d sectors hold neither old nor new" % (what, 128 - new - old))
    elif new == 0 or old == 0: bad.append("%s: all 128 sectors %s: not sector by sector" % (what, "new" if old == 0 else "old"))
    return "%s: %d of 128 sectors new" % (what, new)
m1 = mixed(o, 65536, 0x22, "unflushed origin write")
m2 = mixed(c, 131072, 0x99, "unflushed cow write")
v = o[1024 * S:1025 * S]
if v not in [bytes([b]) * S for b in (0, 0x44, 0x55, 0x66)]: bad.append("the sector written three times holds none of its versions")
if bad: sys.exit("; ".join(bad))
print("verify: ok: %s; %s; sector written three times holds %s" % (m1, m2, v[:1].hex()))
EOF

# run_scenario N: fresh zero images, the scenario, the cut; leaves
# origin-N.img and cow-N.img.
run_scenario() {
    local n=$1 st=0
    head -c $size /dev/zero >"$tmpdir/origin-$n.img"
    head -c $size /dev/zero >"$tmpdir/cow-$n.img"
    rm -f "$tmpdir/trigger-$n" "$tmpdir/report-$n"
    start_disks "$dsock" disk=origin:"$tmpdir/origin-$n.img" \
        disk=cow:"$tmpdir/cow-$n.img" seed="$seed" \
        trigger="$tmpdir/trigger-$n" report="$tmpdir/report-$n"
    PYTHONPATH=$_fn_dir "$PY" "$tmpdir/scenario.py" "$dsock" "$tmpdir/trigger-$n" ||
        check_fail "run $n: the plugin did not behave as a disk that lost power (above)"
    wait_cut "$tmpdir/report-$n"
    grep -q "^seed $seed\$" "$tmpdir/report-$n" ||
        check_fail "run $n: the report does not name seed $seed: $(cat "$tmpdir/report-$n")"
    stop_disks "$dsock"
    "$PY" "$tmpdir/verify.py" "$tmpdir/origin-$n.img" "$tmpdir/cow-$n.img" || st=$?
    [ "$st" -eq 0 ] || check_fail "run $n: the surviving images are wrong (seed $seed)"
}

info "=== 1, 2: a cut with the trigger file"
run_scenario 1
info "=== 3: the same seed again"
run_scenario 2
cmp "$tmpdir/origin-1.img" "$tmpdir/origin-2.img" &&
    cmp "$tmpdir/cow-1.img" "$tmpdir/cow-2.img" &&
    info "ok: the same seed left the same images" ||
    check_fail "the same seed ($seed) left different images"

info "=== 4: cut-after=5"
head -c $size /dev/zero >"$tmpdir/origin-3.img"
start_disks "$dsock" disk=origin:"$tmpdir/origin-3.img" cut-after=5 \
    report="$tmpdir/report-3"
"$PY" - "$dsock" <<'EOF' || check_fail "cut-after=5 did not cut at the sixth request"
import sys
import nbd
sys.path.insert(0, sys.argv[0])
h = nbd.NBD()
h.set_export_name("origin")
h.connect_unix(sys.argv[1])
for i in range(5):
    h.pwrite(b"\x5a" * 512, i * 512)
try:
    h.pread(512, 0)
    sys.exit("request 6 succeeded")
except nbd.Error as e:
    if e.errnum != 5:
        sys.exit("request 6: %s, expected EIO" % e)
h.shutdown()
EOF
wait_cut "$tmpdir/report-3"
grep -q "^requests 5$" "$tmpdir/report-3" && info "ok: the cut came after 5 requests" ||
    check_fail "report after cut-after=5: $(cat "$tmpdir/report-3")"
stop_disks "$dsock"

info "=== 5: restarted on the surviving images"
start_disks "$dsock" disk=origin:"$tmpdir/origin-1.img" disk=cow:"$tmpdir/cow-1.img"
export_equals "$(uri "$dsock" origin)" "$tmpdir/origin-1.img" "restart: origin export == its image"
export_equals "$(uri "$dsock" cow)" "$tmpdir/cow-1.img" "restart: cow export == its image"
stop_disks "$dsock"

finish
