#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# The control socket's limits and the server's log of control actions,
# against a real nbdkit:
#
#  1. a client that sends 8 MiB of stats requests and never reads a
#     reply: the server stops reading it once 256 KiB of replies are
#     queued, so nbdkit's VmRSS (/proc/PID/status) grows by less than
#     48 MiB (the old server queued every reply: hundreds of MiB), and
#     another client is served meanwhile;
#  2. 100 clients connecting at once (non-blocking connects): none gets
#     EAGAIN (listen backlog SOMAXCONN, not 16), all are answered;
#  3. snapshot names: control characters (newline, tab, U+0001, DEL,
#     U+0085), more than 255 bytes, "origin", invalid UTF-8 are refused,
#     over the socket, by snapfgctl and in snapshot=NAME:COW at start-up;
#     255 bytes and non-ASCII UTF-8 are accepted; list --json stays valid;
#  4. max-snapshots=: the default 32 and max-snapshots=3 at run time (the
#     next create refused with a message naming max-snapshots=, no COW
#     file left; after a drop, create works again), and at start-up;
#     bad values refused;
#  5. the log: create/drop/merge/set-block-size are logged with the
#     client's pid and uid (without -v); a client's mistakes (bad JSON,
#     unknown command, no such snapshot) are not logged as errors, and
#     are debug messages with -v;
#  6. an Invalid snapshot (COW store full) is logged with what to do
#     next: drop it and create a new one with a larger COW store.
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

size=$((8 * 1024 * 1024))
test_files "$size"
# Another origin for the other servers and the start-up checks: the
# first server holds a lock on $origin.
other="$tmpdir/other.img"
make_random_image "$other" "$size"
start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock" max-snapshots=3
log="$pid.log"
server_pid=$(cat "$pid")

req() { "$PY" "$CTL_PROTO" request "$ctlsock" "$1"; }

# =====================================================================
info "=== 1. a client that never reads its replies"
out=$("$PY" "$CTL_PROTO" flood "$ctlsock" "$server_pid" --bytes $((8 << 20)) --seconds 30) ||
    check_fail "flood: another client was not served while one was stalled: $out"
info "flood: $out"
sent=$(sed -n 's/.*sent=\([0-9]*\).*/\1/p' <<<"$out")
before=$(sed -n 's/.*rss_before=\([0-9]*\).*/\1/p' <<<"$out")
after=$(sed -n 's/.*rss_after=\([0-9]*\).*/\1/p' <<<"$out")
[ -n "$sent" ] && [ -n "$before" ] && [ -n "$after" ] || fail "flood printed '$out'"
grow=$(( (after - before) / 1024 ))
[ "$grow" -lt 48 ] &&
    info "ok: VmRSS grew by $grow MiB ($before -> $after KiB) while a client sent $sent bytes of requests without reading" ||
    check_fail "VmRSS grew by $grow MiB ($before -> $after KiB): replies to a client that never reads are not bounded"
[ "$sent" -lt $((8 << 20)) ] &&
    info "ok: the server stopped reading the flooding client (it got $sent of $((8 << 20)) bytes through)" ||
    check_fail "the server read all 8 MiB of requests of a client that never read a reply"
ctl_ok "after the flooding client left, status works" "$ctlsock" status

# =====================================================================
info "=== 2. 100 clients connecting at once"
out=$("$PY" "$CTL_PROTO" burst "$ctlsock" 100) &&
    info "ok: 100 simultaneous connects: $out" ||
    check_fail "100 simultaneous connects: $out"

# =====================================================================
info "=== 3. snapshot names"
name_refused() {  # WHAT JSON-NAME FRAGMENT
    local out
    out=$(req "{\"cmd\":\"create\",\"name\":$2,\"cow\":\"$tmpdir/bad.cow\",\"store\":\"transient\"}")
    case $out in
        *'"ok":false'*"$3"*) info "ok: name $1 refused: $out" ;;
        *) check_fail "name $1: $out" ;;
    esac
    [ ! -e "$tmpdir/bad.cow" ] || { check_fail "name $1: a COW file was left"; rm -f "$tmpdir/bad.cow"; }
}
name_refused "with a newline" '"a\nb"' "control character"
name_refused "with a tab" '"a\tb"' "control character"
name_refused "with U+0001" '"a\u0001"' "control character"
name_refused "with DEL" '"a\u007f"' "control character"
name_refused "with U+0085 (C1 control)" '"a\u0085"' "control character"
name_refused "\"origin\"" '"origin"' "reserved"
# "snapshot" is cow='s, even on a server started without cow=.
name_refused "\"snapshot\"" '"snapshot"' "reserved for the snapshot of cow="
name_refused "of 256 bytes" "\"$(printf 'n%.0s' $(seq 256))\"" "255 bytes"
name_refused "empty" '""' "non-empty"
# Invalid UTF-8 cannot even be JSON: jansson refuses the line.
out=$(printf '{"cmd":"create","name":"\xff\xfe","cow":"%s/bad.cow"}\n' "$tmpdir" |
      "$PY" -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(sys.stdin.buffer.read()); print(s.makefile("rb").readline().decode())' "$ctlsock")
case $out in
    *'"ok":false'*) info "ok: a name that is not UTF-8 is refused: $out" ;;
    *) check_fail "a name that is not UTF-8: $out" ;;
esac
ctl_refused "snapfgctl create with a newline in the name" "control character" \
    "$ctlsock" create $'evil\nline' --cow "$tmpdir/bad.cow" --store transient
[ "$(ctl "$ctlsock" create $'\xff\xfe' --cow "$tmpdir/bad.cow"; echo $?)" = 2 ] &&
    info "ok: snapfgctl create with a name that is not UTF-8: usage error: $(head -n1 "$tmpdir/ctl.err")" ||
    check_fail "snapfgctl create with a name that is not UTF-8: $(cat "$tmpdir/ctl.err")"
long=$(printf 'x%.0s' $(seq 255))
ctl_ok "a name of 255 bytes is accepted" "$ctlsock" create "$long" --cow "$tmpdir/long.cow" --store transient
ctl_ok "a name with non-ASCII UTF-8 is accepted" "$ctlsock" create "snäp-é" --cow "$tmpdir/utf8.cow" --store transient
listed "$sock" "snäp-é" && info "ok: the UTF-8 name is an export" || check_fail "snäp-é is not in nbdinfo --list"
ctl_ok "list --json" "$ctlsock" --json list
json_ok "list --json with odd names" "$tmpdir/ctl.out"
[ "$(ctl "$ctlsock" list; grep -c . "$tmpdir/ctl.out")" = 3 ] &&
    info "ok: list prints one line per export" || check_fail "list: $(cat "$tmpdir/ctl.out")"
ctl_ok "drop the long name" "$ctlsock" drop "$long"
ctl_ok "drop snäp-é" "$ctlsock" drop "snäp-é"
# At start-up, the same function checks snapshot=NAME:COW.
for spec in $'a\nb' origin "$(printf 'y%.0s' $(seq 256))" $'t\tab' $'\xc3'; do
    if try_start_failure "$tmpdir/start.err" origin="$other" "snapshot=$spec:$tmpdir/start.cow" store=transient; then
        grep -q "snapshot=" "$tmpdir/start.err" &&
            info "ok: snapshot=$(printf '%q' "$spec" | cut -c1-40):COW refused: $(grep -m1 snapshot= "$tmpdir/start.err" | cut -c1-160)" ||
            check_fail "snapshot=$(printf '%q' "$spec"):COW: the message does not name snapshot=: $(cat "$tmpdir/start.err")"
    fi
done

# =====================================================================
info "=== 4. max-snapshots="
for i in 1 2 3; do
    ctl_ok "create m$i (max-snapshots=3)" "$ctlsock" create "m$i" --cow "$tmpdir/m$i.cow" --store transient
done
ctl_refused "a fourth snapshot" "max-snapshots=3" "$ctlsock" create m4 --cow "$tmpdir/m4.cow"
st=0; ctl "$ctlsock" create m4 --cow "$tmpdir/m4.cow" || st=$?
[ "$st" = 1 ] && info "ok: refused by the server: exit 1" || check_fail "the fourth create exited $st, expected 1"
[ ! -e "$tmpdir/m4.cow" ] && info "ok: the refused create left no COW file" ||
    check_fail "the refused create left $tmpdir/m4.cow"
! listed "$sock" m4 || check_fail "m4 is listed"
ctl_ok "drop m2" "$ctlsock" drop m2
ctl_ok "after a drop, create works again" "$ctlsock" create m4 --cow "$tmpdir/m4.cow" --store transient
for i in 1 3 4; do ctl "$ctlsock" drop "m$i" || check_fail "drop m$i"; done
# The default is 32.
start_snapfg "$tmpdir/d.sock" "$tmpdir/d.pid" origin="$other" control="$tmpdir/d.ctl"
for i in $(seq 32); do
    ctl "$tmpdir/d.ctl" create "d$i" --cow "$tmpdir/d$i.cow" --store transient --cow-size 64K ||
        check_fail "create d$i of 32 (default max-snapshots=32): $(cat "$tmpdir/ctl.err")"
done
ctl_refused "the 33rd snapshot (default max-snapshots=32)" "max-snapshots=32" "$tmpdir/d.ctl" \
    create d33 --cow "$tmpdir/d33.cow" --store transient
stop_nbdkit "$tmpdir/d.pid"
# At start-up: cow= and snapshot= count.
if try_start_failure "$tmpdir/start.err" origin="$other" cow="$tmpdir/s0.cow" \
        "snapshot=s1:$tmpdir/s1.cow" "snapshot=s2:$tmpdir/s2.cow" store=transient max-snapshots=2; then
    try_stderr "$tmpdir/start.err" "max-snapshots=2" && info "ok: three start-up snapshots with max-snapshots=2 are refused"
fi
if try_start_failure "$tmpdir/start.err" origin="$other" "snapshot=snapshot:$tmpdir/reserved.cow" store=transient; then
    try_stderr "$tmpdir/start.err" "reserved for the snapshot of cow=" &&
        info "ok: snapshot=snapshot:COW refused: $(head -n1 "$tmpdir/start.err")"
fi
[ ! -e "$tmpdir/reserved.cow" ] || check_fail "snapshot=snapshot:COW left a COW file"
for v in 0 -1 abc ""; do
    if try_start_failure "$tmpdir/start.err" origin="$other" "max-snapshots=$v"; then
        try_stderr "$tmpdir/start.err" "max-snapshots" && info "ok: max-snapshots=$v refused: $(head -n1 "$tmpdir/start.err")"
    fi
done

# =====================================================================
info "=== 5. the log"
"$SNAPFGCTL" -S "$ctlsock" create logged --cow "$tmpdir/logged.cow" >/dev/null & p=$!
wait "$p" || check_fail "create logged"
"$SNAPFGCTL" -S "$ctlsock" set-block-size 4096 >/dev/null & pb=$!
wait "$pb" || check_fail "set-block-size 4096"
"$SNAPFGCTL" -S "$ctlsock" merge logged --wait >/dev/null & pm=$!
wait "$pm" || check_fail "merge logged --wait"
"$SNAPFGCTL" -S "$ctlsock" create logged2 --cow "$tmpdir/logged2.cow" --store transient >/dev/null
"$SNAPFGCTL" -S "$ctlsock" drop logged2 >/dev/null & pd=$!
wait "$pd" || check_fail "drop logged2"
uid=$(id -u)
for x in "$p:create:\"name\":\"logged\"" "$pb:set-block-size:\"block_size\":4096" "$pm:merge:\"name\":\"logged\"" "$pd:drop:\"name\":\"logged2\""; do
    IFS=: read -r xp xcmd xkey <<<"$x"
    xkey=${x#*:*:}
    if grep -F "control: pid $xp uid $uid: $xcmd: " "$log" | grep -F -- "$xkey" | grep -q ': done$'; then
        info "ok: logged: $(grep -F "control: pid $xp uid $uid: $xcmd: " "$log" | head -n1)"
    else
        check_fail "no log line for $xcmd by pid $xp uid $uid"
    fi
done
# Mistakes: not errors in the log (this server runs without -v).
errors_before=$(grep -c 'error' "$log" || true)
req 'not json' >/dev/null
req '{"cmd":"frobnicate"}' >/dev/null
req '{"cmd":"drop","name":"nosuch"}' >/dev/null
ctl "$ctlsock" merge nosuch || true
ctl "$ctlsock" create snap1 --cow "/nonexistent-dir/$$/x.cow" || true
errors_after=$(grep -c 'error' "$log" || true)
[ "$errors_after" = "$errors_before" ] &&
    info "ok: a client's mistakes (bad JSON, unknown command, no such snapshot, a bad path) are not logged as errors" ||
    { grep error "$log" | tail -n 5 >&2; check_fail "a client's mistakes were logged as errors (above)"; }
# With -v they are debug messages.
NBDKIT_OPTS=-v start_snapfg "$tmpdir/v.sock" "$tmpdir/v.pid" origin="$other" control="$tmpdir/v.ctl"
"$PY" "$CTL_PROTO" request "$tmpdir/v.ctl" '{"cmd":"frobnicate"}' >/dev/null
ctl "$tmpdir/v.ctl" drop nosuch || true
stop_nbdkit "$tmpdir/v.pid"
grep -q 'debug: .*control: .*bad request: unknown command "frobnicate"' "$tmpdir/v.pid.log" &&
    grep -q 'debug: .*control: pid [0-9]* uid [0-9]*: .*no snapshot named "nosuch"' "$tmpdir/v.pid.log" &&
    ! grep -q 'error: .*nosuch' "$tmpdir/v.pid.log" &&
    info "ok: with -v, the mistakes are debug messages naming the client" ||
    { grep -i 'control\|nosuch\|frob' "$tmpdir/v.pid.log" >&2 || true; check_fail "with -v, the mistakes are not debug messages (log above)"; }

# =====================================================================
info "=== 6. an Invalid snapshot says what to do next"
ctl_ok "create a small persistent snapshot" "$ctlsock" create small --cow "$tmpdir/small.cow" --cow-size 64K
cio writes "$(uri "$sock" origin)" --seed 3 --list "0:1048576" >/dev/null 2>&1 || true
ctl "$ctlsock" --json status small || true
json_field() { local got; got=$(jq_py "$1" "$2" 2>&1) || true; [ "$got" = "$3" ] && info "ok: $4" || check_fail "$4: $2 is '$got', expected '$3'"; }
json_field "$tmpdir/ctl.out" 'd["snapshots"][0]["state"]' Invalid "the overfilled snapshot is Invalid"
grep -q 'snapshot small .* is now Invalid: the COW store is full; .*drop it (snapfgctl drop small) and create a new one with a larger COW store' "$log" &&
    info "ok: logged: $(grep -m1 'snapshot small .* is now Invalid' "$log")" ||
    { grep Invalid "$log" >&2 || true; check_fail "the Invalid message does not say what to do next"; }
ctl_refused "merge of the Invalid snapshot" "drop it" "$ctlsock" merge small
ctl_ok "drop small" "$ctlsock" drop small

stop_nbdkit "$pid"
finish
