#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The origin's identity in the state= catalogue (its "origin" object):
# the catalogue itself, not only the stores' bindings, knows its origin
# by size and identity, and origin-moved=true rebinds it.
#
# Two snapshots s1, s2 (stores in STATE.d) with different contents.
# 1. A catalogue written without the identity (as an older snapfg wrote
#    it): matched by path and size, served, and it gains the identity.
# 2. A copy of the origin renamed into its place (same path, same size,
#    same data, another inode): refused by the catalogue, saying what
#    changed (recorded vs current device and inode) and naming
#    origin-moved=true; the catalogue and stores unchanged byte for byte.
#    The original file put back: served again.
# 3. The origin renamed (another path, the same file): still its origin;
#    the catalogue records the new path.
# 4. The origin moved (a copy at a new path, the old one gone): refused
#    without origin-moved=true (catalogue unchanged); with it but the
#    start failing later (STATE.d missing): catalogue unchanged; with it, a notice,
#    and every snapshot and the origin served byte for byte; the next
#    start without origin-moved works (catalogue and stores rebound).
# 5. Another size, with origin-moved=true: refused, catalogue unchanged.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

MiB=$((1024 * 1024))
size=$((8 * MiB))
test_files "$size"
state="$tmpdir/state.json"
rtmp=$(realpath "$tmpdir")     # the catalogue records real paths
exp1="$tmpdir/s1.expected"
exp2="$tmpdir/s2.expected"
expo="$tmpdir/origin.expected"

origin_write() { # SEED OFFSET LENGTH
    cio writes "$(uri "$sock" origin)" --seed "$1" --list "$2:$3" >/dev/null ||
        fail "origin write failed"
}
# origin_field KEY: the catalogue's origin object's KEY.
origin_field() { jq_py "$state" "d['origin'].get('$1')"; }
# served WHAT ORIGIN PARAMS...: start, every snapshot and the origin
# byte for byte, stop.
served() {
    local what=$1
    shift
    start_snapfg "$sock" "$pid" "$@"
    export_equals "$(uri "$sock" s1)" "$exp1" "$what: s1"
    export_equals "$(uri "$sock" s2)" "$exp2" "$what: s2"
    export_equals "$(uri "$sock" origin)" "$expo" "$what: the origin"
    stop_nbdkit "$pid"
}
# refused WHAT ERRFILE-STRINGS... -- PARAMS...: the start is refused with
# those strings in the message; the catalogue and both stores unchanged.
refused() {
    local what=$1 strings=() sums
    shift
    while [ "$1" != -- ]; do strings+=("$1"); shift; done
    shift
    sums=$(cat "$state" "$state.d/s1.cow" "$state.d/s2.cow" | sha256sum)
    if try_start_failure "$tmpdir/start.err" "$@"; then
        try_stderr "$tmpdir/start.err" "${strings[@]}" &&
            info "ok: $what: refused: $(grep -m1 -F "state=" "$tmpdir/start.err")"
    fi
    [ "$(cat "$state" "$state.d/s1.cow" "$state.d/s2.cow" | sha256sum)" = "$sums" ] ||
        check_fail "$what: the catalogue or a store was changed"
}

info "=== set-up: s1, s2 of the origin"
cp "$origin" "$exp1"
start_snapfg "$sock" "$pid" origin="$origin" state="$state" control="$ctlsock"
ctl_ok "create s1" "$ctlsock" create s1
origin_write 1 0 "$MiB"
origin_write 2 $((5 * MiB)) $((512 * 1024))
copy_export "$(uri "$sock" origin)" "$exp2"
ctl_ok "create s2" "$ctlsock" create s2
origin_write 3 $((512 * 1024)) "$MiB"
origin_write 4 $((7 * MiB)) "$MiB"
copy_export "$(uri "$sock" origin)" "$expo"
stop_nbdkit "$pid"
files_equal "$origin" "$expo" "the origin file holds what was written"

info "=== 1. a catalogue without the origin's identity"
[ "$(origin_field ino)" = "$(stat -c %i "$origin")" ] ||
    check_fail "the catalogue does not record the origin's inode: $(jq_py "$state" "d['origin']")"
"$PY" - "$state" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
d["origin"].pop("dev", None)
d["origin"].pop("ino", None)
open(sys.argv[1], "w").write(json.dumps(d, indent=2) + "\n")
EOF
served "no identity recorded" origin="$origin" state="$state"
[ "$(origin_field dev)" = "$(stat -c %d "$origin")" ] &&
    [ "$(origin_field ino)" = "$(stat -c %i "$origin")" ] &&
    info "ok: the catalogue gained the identity: $(jq_py "$state" "d['origin']")" ||
    check_fail "the catalogue did not gain the identity: $(jq_py "$state" "d['origin']")"

info "=== 2. a copy renamed into the origin's place"
ln "$origin" "$tmpdir/kept.img"
cp "$origin" "$tmpdir/copy.img"
mv "$tmpdir/copy.img" "$origin"
refused "the origin replaced" "state=$state: the origin was replaced" \
    "the catalogue recorded origin $rtmp/origin.img" \
    "device $(stat -c %d "$origin") inode $(stat -c %i "$tmpdir/kept.img")" \
    "inode $(stat -c %i "$origin")" "origin-moved=true" \
    -- origin="$origin" state="$state"
mv "$tmpdir/kept.img" "$origin"
served "the original file put back" origin="$origin" state="$state"

info "=== 3. the origin renamed"
renamed="$tmpdir/renamed.img"
mv "$origin" "$renamed"
served "the origin renamed" origin="$renamed" state="$state"
grep -q "now at $rtmp/renamed.img" "$pid.log" ||
    check_fail "the renamed origin: no notice of the new path"
[ "$(origin_field path)" = "$(realpath "$renamed")" ] ||
    check_fail "the catalogue does not record the new path: $(origin_field path)"

info "=== 4. the origin moved (a copy at a new path)"
mkdir "$tmpdir/restored"
moved="$tmpdir/restored/disk.img"
cp "$renamed" "$moved"
rm "$renamed"
refused "the origin moved, without origin-moved" "state=$state" \
    "belongs to origin $rtmp/renamed.img" "origin=$rtmp/restored/disk.img" "origin-moved=true" \
    -- origin="$moved" state="$state"
# A start that fails after the rebinding (STATE.d not there) writes none.
mv "$state.d" "$tmpdir/away.d"
sum=$(checksum "$state")
if try_start_failure "$tmpdir/start.err" origin="$moved" state="$state" origin-moved=true; then
    try_stderr "$tmpdir/start.err" "state directory" "is missing" &&
        info "ok: origin-moved=true, STATE.d missing: refused"
fi
[ "$(checksum "$state")" = "$sum" ] && info "ok: the failed start left the catalogue as it was" ||
    check_fail "origin-moved=true, a failed start: the catalogue was rewritten"
mv "$tmpdir/away.d" "$state.d"
served "origin-moved=true" origin="$moved" state="$state" origin-moved=true
grep -q "origin-moved=true: this catalogue was bound to origin $rtmp/renamed.img" "$pid.log" ||
    check_fail "origin-moved=true: no notice that the catalogue was rebound"
[ "$(origin_field path)" = "$(realpath "$moved")" ] &&
    [ "$(origin_field ino)" = "$(stat -c %i "$moved")" ] ||
    check_fail "origin-moved=true: the catalogue was not rebound: $(jq_py "$state" "d['origin']")"
served "the next start without origin-moved" origin="$moved" state="$state"

info "=== 5. another size, with origin-moved=true"
truncate -s $((size + MiB)) "$moved"
refused "another size" "state=$state" "$size bytes" "$((size + MiB)) bytes" \
    "does not apply to an origin of another size" \
    -- origin="$moved" state="$state" origin-moved=true

finish
