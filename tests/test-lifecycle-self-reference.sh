#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (C) 2026 the snapfg authors
# Self-reference (issue 9 items 11, 12).
#
# 1. A COW that is the origin is refused by path, through a symlink, a
#    hard link, and /proc/PID/fd/N and /proc/self/fd/N paths; a COW
#    that is this server's own export is refused by NBD URI to its
#    Unix socket (directly, through a symlink to the socket, naming a
#    snapshot export), and by nbd:// URI to its own TCP port; at
#    start-up cow= naming the -U socket is refused too.  The origin here
#    reads as zeroes (the case where a store would format itself into
#    it); after every refusal it is unchanged and the server still
#    serves reads, writes and status (no deadlock).
# 2. Item 11: transient T1 on file X, a client holds T1 open, T1 is
#    dropped: "create T2 --cow X" is refused while that client is
#    connected (T1's store still owns X), and works once it has gone; T2
#    then keeps its copied-out chunks (T1's late close does not truncate
#    X under it).
set -euo pipefail
source "$(dirname "$0")/control-functions.sh"
require_control_tools

MiB=$((1024 * 1024))
test_files
make_zero_image "$origin" $((4 * MiB))
port=$((20000 + RANDOM % 20000))
start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock"
sum=$(checksum "$origin")

self_refused() { # WHAT COW MSG
    local st=0
    timeout 60 "$SNAPFGCTL" -S "$ctlsock" create x --cow "$2" >"$tmpdir/ctl.out" 2>"$tmpdir/ctl.err" || st=$?
    if [ "$st" -eq 0 ]; then check_fail "$1: create --cow $2 was accepted"
    elif [ "$st" -ge 124 ]; then check_fail "$1: snapfgctl exited $st (hang?)"
    elif ! grep -qF -- "$3" "$tmpdir/ctl.err"; then check_fail "$1: error lacks '$3': $(cat "$tmpdir/ctl.err")"
    else info "ok: $1: refused: $(head -n1 "$tmpdir/ctl.err")"
    fi
    [ "$(checksum "$origin")" = "$sum" ] || check_fail "$1: the origin changed"
    ctl "$ctlsock" status x && check_fail "$1: x exists after the refusal" || true
}
ln -s "$origin" "$tmpdir/origin-link"
ln "$origin" "$tmpdir/origin-hardlink"
npid=$(nbdkit_pid "$pid")
fd=$(for f in /proc/"$npid"/fd/*; do [ "$(readlink "$f")" = "$origin" ] && basename "$f" && break; done)
[ -n "$fd" ] || fail "cannot find the origin's descriptor in /proc/$npid/fd"
self_refused "cow = origin" "$origin" "origin"
self_refused "cow = a symlink to the origin" "$tmpdir/origin-link" "origin"
self_refused "cow = a hard link to the origin" "$tmpdir/origin-hardlink" "origin"
self_refused "cow = /proc/$npid/fd/$fd" "/proc/$npid/fd/$fd" "origin"
self_refused "cow = /proc/self/fd/$fd (the server's own)" "/proc/self/fd/$fd" "origin"
self_refused "cow = NBD URI of our own origin export" "nbd+unix:///origin?socket=$sock" "own socket"
self_refused "cow = NBD URI of our default export" "nbd+unix:///?socket=$sock" "own socket"
ln -s "$sock" "$tmpdir/sock-link"
self_refused "cow = NBD URI through a symlink to our socket" "nbd+unix:///origin?socket=$tmpdir/sock-link" "own socket"
ctl_ok "create s1 (a real snapshot)" "$ctlsock" create s1 --cow "$tmpdir/s1.cow"
self_refused "cow = NBD URI of our own snapshot export" "nbd+unix:///s1?socket=$sock" "own socket"
cio writes "$(uri "$sock" origin)" --seed 1 --list "0:65536" >/dev/null &&
    info "ok: origin writes still work (no deadlock)" || check_fail "origin write after the refusals"
ctl_ok "status still answers" "$ctlsock" status
ctl_ok "drop s1" "$ctlsock" drop s1
stop_nbdkit "$pid"

# TCP: a server listening on 127.0.0.1:PORT refuses nbd://localhost:PORT.
rm -f "$ctlsock"
sum=$(checksum "$origin")
nbdkit -f -p "$port" --ipaddr 127.0.0.1 -P "$tmpdir/tcp.pid" "$SNAPFG_PLUGIN" \
    origin="$origin" control="$ctlsock" 2>"$tmpdir/tcp.log" &
tcp_pid=$!
on_exit "kill $tcp_pid 2>/dev/null"
if wait_until 30 test -S "$ctlsock"; then
    self_refused "cow = nbd://localhost:$port (our own TCP port)" "nbd://localhost:$port/origin" "own TCP port"
    self_refused "cow = nbd://127.0.0.1:$port" "nbd://127.0.0.1:$port" "own TCP port"
    kill "$tcp_pid"; wait "$tcp_pid" || true
else
    skip_part "TCP case: nbdkit could not listen on port $port: $(tail -n1 "$tmpdir/tcp.log")"
    kill "$tcp_pid" 2>/dev/null || true
fi

# At start-up: cow= naming the socket given to -U.
st=0
timeout 60 nbdkit -U "$tmpdir/sock3" --run true "$SNAPFG_PLUGIN" origin="$origin" \
    cow="nbd+unix:///?socket=$tmpdir/sock3" >/dev/null 2>"$tmpdir/start.err" || st=$?
[ "$st" = 1 ] && grep -q "own socket" "$tmpdir/start.err" &&
    info "ok: cow= naming our own -U socket at start-up is refused: $(head -n1 "$tmpdir/start.err")" ||
    check_fail "cow= naming our own -U socket at start-up: exit $st: $(cat "$tmpdir/start.err")"

info "=== 2. a dropped snapshot's file while a connection still holds it (item 11)"
make_random_image "$origin" $((4 * MiB))
cp "$origin" "$tmpdir/orig.img"
rm -f "$ctlsock"
start_snapfg "$sock" "$pid" origin="$origin" control="$ctlsock"
X="$tmpdir/x.cow"
ctl_ok "create T1 (transient) on X" "$ctlsock" create T1 --store transient --cow "$X"
"$PY" - "$sock" "$tmpdir/t1-ready" "$tmpdir/t1-stop" >"$tmpdir/t1.out" 2>&1 <<'PYEOF' &
import nbd, os, sys, time
h = nbd.NBD(); h.set_export_name("T1"); h.connect_unix(sys.argv[1])
h.pread(4096, 0)
open(sys.argv[2], "w").close()
while not os.path.exists(sys.argv[3]):
    time.sleep(0.05)
h.shutdown()
print("T1 client disconnected")
PYEOF
holder=$!
wait_until 30 test -e "$tmpdir/t1-ready" || fail "the T1 client did not connect"
ctl_ok "drop T1 (its client still connected)" "$ctlsock" drop T1
ctl_refused "create T2 on X while T1's client holds it" "still used by 1 connection" \
    "$ctlsock" create T2 --store transient --cow "$X"
ctl_refused "create P2 (persistent) on X while T1's client holds it" "dropped but still used" \
    "$ctlsock" create P2 --cow "$X"
touch "$tmpdir/t1-stop"; wait "$holder" || check_fail "the T1 client: $(cat "$tmpdir/t1.out")"
wait_until 30 bash -c "'$SNAPFGCTL' -S '$ctlsock' create T2 --store transient --cow '$X' 2>/dev/null" &&
    info "ok: create T2 on X works once T1's last client has gone" ||
    check_fail "create T2 on X after T1's client disconnected"
cio writes "$(uri "$sock" origin)" --seed 5 --list "0:$((2 * MiB))" >/dev/null || fail "origin writes"
export_equals "$(uri "$sock" T2)" "$tmpdir/orig.img" "T2 holds the origin's old data for the overwritten chunks"
ctl_ok "drop T2" "$ctlsock" drop T2
stop_nbdkit "$pid"
finish
