#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# snapfgctl changed on a snapshot whose changed ranges are not known:
#
# 1. An Invalid snapshot (its COW store overflowed during origin writes:
#    the origin writes after that were not copied out, so a range list
#    built from its exceptions misses them).  "changed" must fail (exit
#    non-zero, also with --json: "ok": false) with a message that says
#    the snapshot is Invalid, while "changed" on a valid snapshot beside
#    it still lists exactly the ranges written.
# 2. A snapshot being merged into the origin (its exceptions are merged
#    away one batch after another): "changed" must fail and say so.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

chunk=4096
size=$((4 * 1024 * 1024))
test_files "$size"

# --- 1. Invalid ---------------------------------------------------------
start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock"
# 4 chunks of transient store: the fifth origin chunk written overflows it.
ctl_ok "create small (4 chunks of COW)" "$ctlsock" create small \
    --cow "$tmpdir/small.cow" --store transient --chunk-size $chunk --cow-size $((4 * chunk))
ctl_ok "create big (room for every chunk)" "$ctlsock" create big \
    --cow "$tmpdir/big.cow" --store transient --chunk-size $chunk
for c in 1 3 5 7 9 11; do
    failures_io write "$(uri "$sock" origin)" $((c * chunk)) $chunk --seed $c >/dev/null ||
        fail "origin write to chunk $c failed"
done
ctl "$ctlsock" --json status small || true
state=$(jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["state"]')
[ "$state" = Invalid ] && info "ok: snapshot small is Invalid after 6 copy-outs into 4 chunks" ||
    fail "snapshot small is '$state' after overflowing its COW store, expected Invalid"

ctl_refused "changed on the Invalid snapshot" "Invalid" "$ctlsock" changed small
ctl_refused "changed on the Invalid snapshot says a full backup is needed" "full backup" "$ctlsock" changed small
st=0; ctl "$ctlsock" --json changed small || st=$?
[ "$st" -ne 0 ] || check_fail "changed --json on the Invalid snapshot exited 0"
if [ -s "$tmpdir/ctl.out" ]; then
    json_ok "changed --json on the Invalid snapshot" "$tmpdir/ctl.out"
    [ "$(jq_py "$tmpdir/ctl.out" 'd["ok"]')" = false ] &&
        info "ok: changed --json on the Invalid snapshot replies ok: false" ||
        check_fail "changed --json on the Invalid snapshot: $(cat "$tmpdir/ctl.out")"
    grep -q Invalid "$tmpdir/ctl.out" "$tmpdir/ctl.err" ||
        check_fail "changed --json on the Invalid snapshot does not say Invalid: $(cat "$tmpdir/ctl.out" "$tmpdir/ctl.err")"
fi

ctl_ok "changed on the valid snapshot big" "$ctlsock" changed big
printf '%s\n' "$((1 * chunk)) $chunk" "$((3 * chunk)) $chunk" "$((5 * chunk)) $chunk" \
    "$((7 * chunk)) $chunk" "$((9 * chunk)) $chunk" "$((11 * chunk)) $chunk" \
    "# 6 ranges, $((6 * chunk)) bytes changed" >"$tmpdir/changed-big.want"
files_equal "$tmpdir/ctl.out" "$tmpdir/changed-big.want" "changed big lists the six chunks written"
ctl_ok "drop small" "$ctlsock" drop small
ctl_ok "drop big" "$ctlsock" drop big
stop_nbdkit "$pid"

# --- 2. merging ---------------------------------------------------------
# 64 exceptions, merged 16 at a time with 3 s per batch: about 12 s.
SNAPFG_TEST_MERGE_DELAY_US=3000000 \
    start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock"
ctl_ok "create m (persistent)" "$ctlsock" create m --cow "$tmpdir/m.cow" --chunk-size $chunk
failures_io write "$(uri "$sock" origin)" 0 $((64 * chunk)) --seed 99 >/dev/null ||
    fail "origin write of 64 chunks failed"
ctl_ok "changed on m before the merge" "$ctlsock" changed m
grep -qx "# 1 ranges, $((64 * chunk)) bytes changed" "$tmpdir/ctl.out" ||
    check_fail "changed m before the merge: $(cat "$tmpdir/ctl.out")"
ctl_ok "merge m" "$ctlsock" merge m
ctl "$ctlsock" --json status m || true
state=$(jq_py "$tmpdir/ctl.out" 'd["snapshots"][0]["state"] if d["ok"] else "gone"')
[ "$state" = merging ] || fail "snapshot m is '$state' right after merge, expected merging"
ctl_refused "changed on the merging snapshot" "merged" "$ctlsock" changed m
wait_until 120 bash -c "! '$SNAPFGCTL' -S '$ctlsock' status m >/dev/null 2>&1" ||
    fail "the merge of m did not finish within 120 s"
info "ok: the merge of m finished"
stop_nbdkit "$pid"

finish
