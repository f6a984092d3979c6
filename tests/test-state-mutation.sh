#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The state files, damaged or tampered with (issue 19 rows 4, 7, 9, 10,
# 12 and the structured mutation test): a server with state= gets
# snapshots s1 (its store in the state directory), s2 and s3 (--cow) and
# checkpoints c1 and c2; a second server of another origin gets x1.
# Then, for every case of tests/state-mutation.py (types and values of
# every field, duplicates, swapped fields, truncation, files swapped
# between records or servers, links, owners and modes), the state is
# put back as it was, mutated, and the server started on it.  Each case
# must end as the table says, and only in one of two ways:
#   refuse: the start fails, its message says what is wrong, and every
#           state file is exactly as it was (listing, modes, owners,
#           contents);
#   serve:  the server starts and serves exactly the snapshots the
#           table names, byte for byte, no file is gone, and exactly the
#           checkpoints the table names are recorded as inconsistent.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools
requires find sha256sum

SM="$(cd "$(dirname "$0")" && pwd)/state-mutation.py"
MiB=$((1024 * 1024))
test_files $((4 * MiB))
work="$tmpdir/w"
st="$work/st"
mkdir -p "$st" "$work/stB" "$work/expect"
origin_write() { # SEED OFFSET LENGTH
    cio writes "$(uri "$sock" origin)" --seed "$1" --list "$2:$3" >/dev/null ||
        fail "origin write failed"
}

info "=== the state the cases start from"
rm -f "$ctlsock"
start_snapfg "$sock" "$pid" origin="$origin" state="$st/cat.json" control="$ctlsock"
ctl_ok "checkpoint c1" "$ctlsock" checkpoint create c1
cp "$origin" "$work/expect/s1.img"
ctl_ok "create s1 (state directory)" "$ctlsock" create s1
origin_write 1 0 $MiB
cp "$origin" "$work/expect/s2.img"
ctl_ok "create s2 --cow" "$ctlsock" create s2 --cow "$st/s2.cow" --chunk-size 64K
ctl_ok "checkpoint c2" "$ctlsock" checkpoint create c2
origin_write 2 $((512 * 1024)) $((2 * MiB))
cp "$origin" "$work/expect/s3.img"
ctl_ok "create s3 --cow" "$ctlsock" create s3 --cow "$st/s3.cow"
origin_write 3 $((3 * MiB)) $MiB
stop_nbdkit "$pid"
cp "$origin" "$work/expect/origin.img"
[ -f "$st/cat.json.d/s1.cow" ] && [ -f "$st/cat.json.d/c1.cbt" ] &&
    [ -f "$st/cat.json.d/c2.cbt" ] || fail "the state directory lacks s1.cow, c1.cbt or c2.cbt"

make_random_image "$tmpdir/originB.img" $((4 * MiB))
rm -f "$ctlsock"
start_snapfg "$sock" "$pid" origin="$tmpdir/originB.img" state="$work/stB/catB.json" control="$ctlsock"
ctl_ok "server B: create x1" "$ctlsock" create x1
stop_nbdkit "$pid"
cp -a "$st" "$tmpdir/pristine-st"

# listing: every file and link under the state, with type, mode,
# owner, size, link target and contents' checksum.
listing() {
    local dirs=(st)
    [ -e "$work/elsewhere.d" ] && dirs+=(elsewhere.d)
    (cd "$work" && find "${dirs[@]}" -printf '%p %y %m %U %s %l\n' | sort &&
        find "${dirs[@]}" -type f -exec sha256sum {} + | sort)
}

cases=0
while read -r name expect; do
    expect=${expect//$'\x1f'/ }
    cases=$((cases + 1))
    rm -rf "$st" "$work/elsewhere.d"
    cp -a "$tmpdir/pristine-st" "$st"
    "$PY" "$SM" apply "$name" "$work" || fail "$name: cannot apply the mutation"
    listing >"$tmpdir/before.txt"
    marker="$tmpdir/served.$name"
    exports=${expect#serve:}
    [ "$exports" != "$expect" ] || exports=-
    inconsistent=
    case $exports in
    *";inconsistent="*) inconsistent=${exports#*;inconsistent=}; exports=${exports%%;*} ;;
    esac
    status=0
    timeout 60 nbdkit -U - --run "'$PY' '$SM' verify \"\$unixsocket\" '$work' '$exports' '$marker'" \
        "$SNAPFG_PLUGIN" origin="$origin" state="$st/cat.json" \
        >"$tmpdir/run.out" 2>"$tmpdir/run.err" || status=$?
    listing >"$tmpdir/after.txt"
    case $expect in
    refuse:*)
        msg=${expect#refuse:}
        if [ -e "$marker" ]; then
            check_fail "$name: the server started (exit $status); it must refuse: $(head -c 400 "$tmpdir/run.err")"
        elif [ "$status" -ne 1 ]; then
            check_fail "$name: nbdkit exited $status, not 1 (a crash or hang?): $(tail -c 400 "$tmpdir/run.err")"
        elif ! grep -qF -- "$msg" "$tmpdir/run.err"; then
            check_fail "$name: refused, but the message lacks '$msg': $(head -c 600 "$tmpdir/run.err")"
        elif ! cmp -s "$tmpdir/before.txt" "$tmpdir/after.txt"; then
            check_fail "$name: refused, but the files changed: $(diff "$tmpdir/before.txt" "$tmpdir/after.txt" | head -c 600)"
        else
            info "ok: $name: refused, nothing changed: $(grep -m1 -F -- "$msg" "$tmpdir/run.err" | cut -c1-220)"
        fi ;;
    serve:*)
        gone=$(grep -v '^[0-9a-f]\{64\} ' "$tmpdir/before.txt" | awk '{print $1}' |
               while read -r f; do [ -e "$work/$f" ] || [ -L "$work/$f" ] || echo "$f"; done)
        if [ ! -e "$marker" ]; then
            check_fail "$name: the server refused to start; it must serve: $(head -c 600 "$tmpdir/run.err")"
        elif [ "$status" -ne 0 ]; then
            check_fail "$name: the server does not serve exactly $exports: $(tail -c 600 "$tmpdir/run.err")"
        elif [ -n "$gone" ]; then
            check_fail "$name: served, but files are gone: $gone"
        elif [ -f "$st/cat.json" ] &&
             got=$(jq_py "$st/cat.json" '",".join(sorted(c["name"] for c in d["checkpoints"] if c["state"] == "inconsistent"))') &&
             [ "$got" != "$inconsistent" ]; then
            check_fail "$name: served, but the catalogue records checkpoints '$got' as inconsistent, expected '$inconsistent'"
        else
            info "ok: $name: served exactly ${exports/-/the origin alone}, no file gone${inconsistent:+, checkpoints $inconsistent inconsistent}"
        fi ;;
    *) fail "$name: unknown expectation '$expect'" ;;
    esac
done < <("$PY" "$SM" cases)
[ "$cases" -gt 50 ] || fail "only $cases cases ran"
info "$cases cases"
finish
